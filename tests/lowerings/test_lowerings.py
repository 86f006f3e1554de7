"""The sdm lowerings under Inductor: what the generated code calls, what fuses,
dynamic shapes, backward, a module with a learned bank, CUDA kernels in the output code.

Each CPU ``torch.compile`` costs 15-45 s on two cores: the compiled functions live in
module-scoped fixtures and every test reuses them.
"""
from __future__ import annotations

import os
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.utils import fresh_cache, run_and_get_code

import sdm_inductor
from sdm_inductor.lowerings import write_read as lowering
from sdm_inductor.nn import SparseDeltaMemory
from sdm_inductor.reference import sdm_write_read_reference
from sdm_inductor.testing import Sm90Target, make_inputs, rel_err

SPH, HD, C = 32, 8, 16
CUDA = torch.cuda.is_available() and lowering.triton_op("write_read", torch.device("cuda"))
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and the sdm Triton kernels")


@pytest.fixture(scope="module", autouse=True)
def fresh_caches():
    # The rules run while AOTAutograd traces; a warm FX/AOT cache would skip them. A cache
    # of this module's own (cold when it starts): each graph compiled here is a different
    # one, so every compile runs the rules, and later ones reuse the C++ kernels built.
    with fresh_cache():
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()


@pytest.fixture
def no_caches():
    """For tests that compile one graph several times under settings that the cache keys
    do not see (``lowering.EMIT_KERNELS``): nothing cached, every compile from scratch."""
    with torch._inductor.config.patch(force_disable_caches=True):
        yield


def gated(bank, k_idx, k_logit, v, b_logit, a, q_idx, q_logit, A_log, dt_bias, z):
    """The SDM op with the elementwise math that usually surrounds it: softmax weights,
    sigmoid write strength, Mamba-style decay ``-exp(A_log) * softplus(a + dt_bias)``
    (prologue) and a silu output gate (epilogue)."""
    g = -torch.exp(A_log) * F.softplus(a + dt_bias)
    y, M = sdm_inductor.write_read(
        bank, k_idx, torch.softmax(k_logit, -1), v, torch.sigmoid(b_logit), g, q_idx,
        torch.softmax(q_logit, -1), chunk_size=C, slots_per_stream=SPH)
    return y * F.silu(z), M


def gated_inputs(P, T, dtype=torch.float32, seed=0, device="cpu"):
    ins = make_inputs(P, T, W=4, R=3, hd=HD, slots_per_stream=SPH, dtype=dtype, seed=seed,
                      device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    r = lambda *s: torch.randn(*s, generator=gen).to(device)
    return [ins.bank, ins.k_idx, r(P, T, 4).to(dtype), ins.v, r(P, T), r(P, T, 1), ins.q_idx,
            r(P, T, 3).to(dtype), r(1, 1, 1) * 0.5, r(1, 1, 1), r(P, T, HD).to(dtype)]


def gated_reference(args):
    """The same function with the op replaced by the oracle token loop, in float64
    (differentiable: gradients reach the float leaves of ``args``)."""
    bank, k_idx, k_logit, v, b_logit, a, q_idx, q_logit, A_log, dt_bias, z = (
        t.double() if t.is_floating_point() else t for t in args)
    g = -torch.exp(A_log) * F.softplus(a + dt_bias)
    y, M = sdm_write_read_reference(
        bank, k_idx, torch.softmax(k_logit, -1), v, torch.sigmoid(b_logit), g, q_idx,
        torch.softmax(q_logit, -1), compute_dtype=torch.float64)
    return y * F.silu(z), M


def extern_calls(code: str) -> list[str]:
    return re.findall(r"torch\.ops\.sdm\.(\w+)\.default\(", code)


def cpu_kernels(code: str) -> list[str]:
    return re.findall(r"^(cpp_fused_\w+) = async_compile", code, flags=re.M)


# ---------------------------------------------------------------- forward, no grad (CPU)

@pytest.fixture(scope="module")
def compiled_gated():
    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(gated, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        args = gated_inputs(2, 40)
        out, codes = run_and_get_code(fn, *args)
    return fn, counter, args, out, codes


@pytest.mark.compile
def test_cpu_forward_is_one_extern_call_with_fused_neighbours(compiled_gated):
    _, counter, args, out, codes = compiled_gated
    (code,) = codes
    # 40 tokens, one call of the chunked CPU path; nothing per token or per chunk
    assert extern_calls(code) == ["write_read_"], code
    kernels = cpu_kernels(code)
    # the whole prologue (both softmaxes, sigmoid, exp/softplus gate, the copy of the bank
    # that the functional op makes) is one kernel, the output gate another
    prologue = [k for k in kernels if "softplus" in k]
    assert len(prologue) == 1 and all(w in prologue[0] for w in ("softmax", "sigmoid", "exp")), kernels
    assert len(kernels) == 2, kernels
    call = code[code.index("def call(") :]
    bank_copy = re.search(rf"{prologue[0]}\(([^)]*)\)", call).group(1)
    assert "arg" in bank_copy  # reads the inputs directly: no separate pass before it
    y_ref, M_ref = gated_reference(args)
    assert rel_err(out[0], y_ref) < 1e-5 and rel_err(out[1], M_ref) < 1e-5
    assert counter.frame_count == 1


@pytest.mark.compile
def test_cpu_new_lengths_do_not_recompile(compiled_gated):
    fn, counter, *_ = compiled_gated
    with torch.no_grad():
        for P, T in ((2, 17), (3, 71)):
            args = gated_inputs(P, T, seed=T)
            y, M = fn(*args)
            y_eager, M_eager = gated(*args)
            assert rel_err(y, y_eager) < 1e-6 and rel_err(M, M_eager) < 1e-6
    assert counter.frame_count == 1


@pytest.mark.compile
def test_cpu_bf16_bank_matches_oracle():
    fn = torch.compile(gated, fullgraph=True)
    args = gated_inputs(2, 24, dtype=torch.bfloat16, seed=3)
    with torch.no_grad():
        y, M = fn(*args)
    y_ref, M_ref = gated_reference(args)
    assert y.dtype == M.dtype == torch.bfloat16
    assert rel_err(y, y_ref) < 2e-2 and rel_err(M, M_ref) < 2e-2


# ---------------------------------------------------------------- forward + backward (CPU)

def loss_of(args, fn=gated):
    y, M = fn(*args)
    return y.square().sum() + (M * M.detach().sin()).sum()


def float_leaves(args):
    return [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]


def test_emit_kernels_policy(monkeypatch):
    """Which graphs launch the CUDA kernels from their own code: by default AOTInductor
    packages only (torch.compile keeps the op as an extern call of the eager step walks);
    "always" for every graph; "never" for none; a bad setting is named. CPU has no kernels to emit."""
    from torch._inductor.virtualized import V
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    if lowering.triton_op("write_read", cuda) is None:
        pytest.skip("the sdm Triton ops are not registered (no triton)")
    assert lowering.EMIT_KERNELS == "aot"
    assert lowering.emitted("write_read", cuda) is None
    with V.set_aot_compilation(True):
        assert lowering.emitted("write_read", cuda) is lowering.triton_op("write_read", cuda)
        assert lowering.emitted("write_read", cpu) is None
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "always")
    assert lowering.emitted("write_read_backward", cuda) is not None
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "never")
    assert lowering.emitted("write_read", cuda) is None
    with V.set_aot_compilation(True):
        assert lowering.emitted("write_read_gated", cuda) is None
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "sometimes")
    with pytest.raises(ValueError, match="EMIT_KERNELS.*'never', got 'sometimes'"):
        lowering.emitted("write_read", cuda)


def _traced_training_graphs(fn, args, monkeypatch) -> dict:
    """AOTAutograd's forward and backward graphs of a training step through ``fn`` with
    the CUDA kernels emitted, traced on CPU tensors (the kernels are recorded, never run:
    each graph runs on fake tensors and returns zeros): the kernels each graph launches
    (name, arguments other than tensors), in order, and whether it sorts."""
    import triton
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(lowering, "TRITON_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "always")
    monkeypatch.setattr(triton.runtime.driver, "_active", Sm90Target())
    graphs = {}

    def capture(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm

            def run(*a):
                with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                    out = gm(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                               for x in a])
                return [torch.zeros(o.shape, dtype=o.dtype) if isinstance(o, torch.Tensor)
                        else o for o in out]
            return make_boxed_func(run)
        return compiler

    backend = aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw"))
    torch._dynamo.reset()
    y, M = torch.compile(fn, backend=backend, fullgraph=True)(*float_leaves(args))
    (y.sum() + M.sum()).backward()
    launches = {}
    for kind, gm in graphs.items():
        launches[kind] = [
            (getattr(kernel_side_table.get_kernel(n.kwargs["kernel_idx"]), "fn", None).__name__,
             {k: v for k, v in n.kwargs["kwargs"].items() if not isinstance(v, torch.fx.Node)})
            for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
        launches[kind + " sorts"] = any("sort" in str(n.target) for n in gm.graph.nodes)
    torch._dynamo.reset()   # (after reading the kernel side table: this clears it)
    return launches


PHASE1_KERNELS = {"_prep_kernel", "_block_writes_kernel", "_group_bounds_kernel",
                  "_group_sizes_kernel", "_pairs_kernel", "_inverse_kernel"}


@pytest.mark.parametrize("walk,gated_op", [("queue", False), ("queue", True),
                                           ("column", False)])
def test_emitted_backward_takes_the_forwards_plan_and_v_minus_r0(walk, gated_op, monkeypatch):
    """A compiled training step whose kernels are emitted: the forward hands its Phase 1
    (and after the queue walk ``v - r0``) to the backward as values of the graph, so the
    backward graph runs no Phase 1 (no prep, groups, pairs or inverse kernel, no sort) and
    the reverse queue walk no gathers (``KEPT``); the forward's queue walk stores
    ``v - r0`` (``KEEP``). W = 17 takes the queue walks, W = 4 the column walks
    (``launch.column_suits``). Correctness of the hand-over is the interpreter's
    ``queue_walk`` and ``column_walk`` cases (the same host code on real tensors) and the
    CUDA tests."""
    pytest.importorskip("triton")
    ins = make_inputs(P=2, T=37, W=17 if walk == "queue" else 4, R=3, hd=18,
                      slots_per_stream=24, seed=5)
    if gated_op:
        raw = torch.randn(2, 37), torch.randn(2, 37), torch.randn(2), torch.randn(2)

        def fn(bank, k_idx, k_val, v, beta, g, q_idx, q_val):
            return sdm_inductor.api.write_read_gated(
                bank, k_idx, k_val, v, beta, g, *raw[2:], q_idx, q_val, chunk_size=C,
                slots_per_stream=24)
        args = [ins.bank, ins.k_idx, ins.k_val, ins.v, *raw[:2], ins.q_idx, ins.q_val]
    else:
        def fn(*a):
            return sdm_inductor.write_read(*a, chunk_size=C, slots_per_stream=24)
        args = list(ins)
    launches = _traced_training_graphs(fn, args, monkeypatch)
    fw = dict(launches["fw"])
    bw = [name for name, _ in launches["bw"]]
    print("forward:", list(fw), "\nbackward:", bw)
    assert PHASE1_KERNELS <= set(fw) and launches["fw sorts"], fw
    assert not PHASE1_KERNELS & set(bw) and not launches["bw sorts"], bw
    if walk == "queue":
        assert fw["_queue_walk_kernel"]["KEEP"] is True
        assert dict(launches["bw"])["_queue_reverse_kernel"]["KEPT"] is True
    else:
        assert "_forward_kernel" in fw and "_reverse_kernel" in bw, (fw, bw)


@pytest.mark.parametrize("rewrites_on", [True, False])
def test_graph_cache_keys_follow_emit_kernels(rewrites_on, monkeypatch):
    """Inductor's FX graph cache key hashes the custom passes' uuids: with the rewrites on
    or off, a graph lowered with the other ``EMIT_KERNELS`` (kernels emitted or the eager op
    called) or by other package sources is not replayed."""
    from torch._inductor import config as inductor_config
    from torch._inductor.codecache import FxGraphHashDetails
    with sdm_inductor.rewrites(rewrites_on):
        keys = {}
        for emit in ("aot", "always", "aot"):
            monkeypatch.setattr(lowering, "EMIT_KERNELS", emit)
            details = FxGraphHashDetails.__new__(FxGraphHashDetails)   # (its passes' part)
            keys.setdefault(emit, set()).add(repr([
                details._get_custom_pass_detail(getattr(inductor_config, slot))
                for slot in ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")]))
        assert len(keys["aot"]) == 1 and keys["aot"] != keys["always"], keys


def test_symbolic_int_options_are_specialized():
    """``dynamic=True`` makes int arguments and closure variables symbolic. The chunk size
    and the slots per stream shape the kernels: the graph specializes on them (a guard;
    another value recompiles) instead of handing the op a symbol it refuses. AOTAutograd
    with the eager backend runs the same rules as Inductor, without a C++ compile."""
    counter = CompileCounterWithBackend("aot_eager")

    def op(chunk, *args):
        y, M = sdm_inductor.write_read(*args, chunk_size=chunk, slots_per_stream=SPH)
        return y.square().sum() + (M * M.detach().sin()).sum()

    fn = torch.compile(op, backend=counter, fullgraph=True, dynamic=True)
    ins = make_inputs(2, 21, W=4, R=3, hd=HD, slots_per_stream=SPH, seed=3)
    for chunk in (16, 32, 16):
        got, want = float_leaves(ins), float_leaves(ins)
        fn(chunk, *got).backward()
        op(chunk, *want).backward()
        for a, b in zip(got, want):
            if a.requires_grad:
                assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6), chunk
    assert counter.frame_count == 2, counter.frame_count   # 16, 32; the second 16 reuses


@pytest.mark.compile
def test_cpu_backward_compiled_matches_oracle():
    fn = torch.compile(gated, fullgraph=True)
    args = float_leaves(gated_inputs(2, 21, seed=5))

    def step():
        loss_of(args, fn).backward()

    _, (fw, bw) = run_and_get_code(step)
    assert extern_calls(fw) == ["write_read"], fw
    assert extern_calls(bw) == ["write_read_backward"], bw
    ref = float_leaves(args)
    y, M = gated_reference(ref)
    (y.square().sum() + (M * M.detach().sin()).sum()).backward()
    for a, r in zip(args, ref):
        if a.requires_grad:
            assert rel_err(a.grad, r.grad) < 1e-4, (a.shape, rel_err(a.grad, r.grad))


# ---------------------------------------------------------------- layout helpers (CPU)

def with_helpers(memory, k_idx, k_logit, vx, beta, q_idx, q_logit, z, g):
    """Head split of a projection, per-batch copy of a learned bank, head merge + gate."""
    B, H = vx.shape[0], 2
    y, M = sdm_inductor.write_read(
        torch.ops.sdm.expand_bank(memory, B), k_idx, torch.softmax(k_logit, -1),
        torch.ops.sdm.split_heads(torch.tanh(vx), H), beta, g, q_idx,
        torch.softmax(q_logit, -1), chunk_size=C, slots_per_stream=SPH)
    return torch.ops.sdm.merge_heads(y, H) * F.silu(z), M


@pytest.mark.compile
def test_cpu_layout_helpers_decompose_and_fuse():
    B, H, T = 2, 2, 19
    ins = make_inputs(B * H, T, W=4, R=3, hd=HD, slots_per_stream=SPH, seed=21)
    gen = torch.Generator().manual_seed(22)
    r = lambda *s: torch.randn(*s, generator=gen)
    args = [r(H * SPH, HD), ins.k_idx, r(B * H, T, 4), r(B, T, H * HD), ins.beta, ins.q_idx,
            r(B * H, T, 3), r(B, T, H * HD), ins.g]
    compiled, eager = float_leaves(args), float_leaves(args)
    fn = torch.compile(with_helpers, fullgraph=True)

    def step():
        loss_of(compiled, fn).backward()

    _, (fw, bw) = run_and_get_code(step)
    # the helpers are gone: copies fused into Inductor kernels, one sdm call each way
    assert extern_calls(fw) == ["write_read"] and extern_calls(bw) == ["write_read_backward"], (
        extern_calls(fw), extern_calls(bw))
    loss_of(eager, with_helpers).backward()
    for a, b in zip(compiled, eager):
        if a.requires_grad:
            assert rel_err(a.grad, b.grad) < 1e-5, list(a.shape)
    assert compiled[0].grad.abs().sum() > 0   # summed back over the batch to the learned bank


# ---------------------------------------------------------------- a module (CPU)

@pytest.mark.compile
def test_cpu_module_learned_bank_dynamic_batch_and_length():
    torch.manual_seed(0)
    layer = SparseDeltaMemory(32, num_heads=2, slots_per_head=16, top_k=4, key_dim=8,
                              output_gate=True, chunk_size=16)
    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(layer, backend=counter, fullgraph=True)
    for B, T in ((2, 20), (3, 37)):
        x = torch.randn(B, T, 32)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
        layer.zero_grad()
        fn(x).square().mean().backward()
        got = {n: p.grad.clone() for n, p in layer.named_parameters()}
        layer.zero_grad()
        layer(x).square().mean().backward()
        for n, p in layer.named_parameters():
            assert rel_err(got[n], p.grad) < 1e-4, n
    assert layer.memory.grad.abs().sum() > 0  # the gradient reached the learned bank
    assert counter.frame_count == 1


# ---------------------------------------------------------------- CUDA

def _sdm_kernel_names() -> set[str]:
    """Names of the Triton kernels defined in ``sdm_inductor.kernels``."""
    import triton
    names = set()
    for name, mod in list(sys.modules.items()):
        if name.startswith("sdm_inductor.kernels"):
            for v in vars(mod).values():
                if isinstance(v, (triton.runtime.JITFunction, triton.runtime.Autotuner)):
                    names.add(getattr(v, "fn", v).__name__)
    return names


def _dump(name: str, code: str):
    """Keep generated code as evidence when SDM_DUMP_CODE names a folder."""
    folder = os.environ.get("SDM_DUMP_CODE")
    if folder:
        with open(os.path.join(folder, name), "w") as f:
            f.write(code)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.parametrize("dynamic,emit", [(True, "always"), (False, "always"), (False, "aot")])
def test_cuda_output_code_launches_sdm_kernels_forward_and_backward(dynamic, emit, monkeypatch,
                                                                   no_caches):
    """``EMIT_KERNELS="always"``: static and symbolic lengths alike launch single-kernel
    walks from the output code (one compilation for every ``T``; the step walks unrolled
    per chunk made Inductor define one kernel per call site): this small shape's column
    walk (``launch.column_suits``; larger ones take the queue walk). The default ("aot"): one extern call of the eager op each way (its step
    walks), the neighbours still fused around it."""
    monkeypatch.setattr(lowering, "EMIT_KERNELS", emit)
    fn = torch.compile(gated, fullgraph=True, dynamic=dynamic)
    args = float_leaves(gated_inputs(2, 40, seed=7, device="cuda"))

    def step():
        y, M = fn(*args)
        (y.square().sum() + (M * M.detach().sin()).sum()).backward()
        return y.detach(), M.detach()

    (y, M), (fw, bw) = run_and_get_code(step)
    _dump(f"cuda_gated_forward_{emit}.py", fw)
    _dump(f"cuda_gated_backward_{emit}.py", bw)
    names = _sdm_kernel_names()
    in_fw = {n for n in names if re.search(rf"\b{n}\b", fw)}
    in_bw = {n for n in names if re.search(rf"\b{n}\b", bw)}
    print("sdm kernels in forward code:", sorted(in_fw), "backward:", sorted(in_bw))
    if emit == "aot":
        assert extern_calls(fw) == ["write_read"] and extern_calls(bw) == ["write_read_backward"], (
            extern_calls(fw), extern_calls(bw))
        assert not in_fw | in_bw, (in_fw, in_bw)
    else:
        assert not extern_calls(fw) and not extern_calls(bw), (extern_calls(fw), extern_calls(bw))
        assert "_forward_kernel" in in_fw and "_reverse_kernel" in in_bw, (in_fw, in_bw)
        assert not any(n.startswith("_step") for n in in_fw | in_bw), (in_fw, in_bw)
        assert in_bw - in_fw, (names, in_bw)
        # the backward takes the forward's Phase 1 (saved activations), computes none
        assert not PHASE1_KERNELS & in_bw, in_bw
    # the lowering against the eager op (the same kernels): only fusion-order rounding
    eager = float_leaves(args)
    loss_of(eager, gated).backward()
    for a, b in zip(args, eager):
        if a.requires_grad:
            err = rel_err(a.grad, b.grad)
            print(f"grad {list(a.shape)}: compiled vs eager rel err {err:.1e}")
            assert err < 1e-5, (list(a.shape), err)
    # and the values against the oracle
    y_ref, M_ref = gated_reference([a.detach().cpu() for a in args])
    assert rel_err(y.cpu(), y_ref) < 1e-4 and rel_err(M.cpu(), M_ref) < 1e-4


@needs_cuda
@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.parametrize("dtype,chunk", [(torch.float32, C), (torch.bfloat16, 128)])
def test_cuda_output_code_queue_walk_matches_eager_at_every_length(dtype, chunk, monkeypatch,
                                                                  no_caches):
    """A shape past ``launch.column_suits`` (W = 17, two 128-column groups per stream):
    the output code launches the queue walks, forward and backward (the backward with the
    forward's Phase 1 and ``v - r0``, no Phase 1 of its own); one compilation serves
    two lengths (at C = 128 one chunk, then two: no guard on the chunk count), and its
    readings, bank and gradients are the eager step walks' up to rounding order (bf16: the
    forward's gathers sum a token's rows over 4 warps, the step walk's over one) and the
    oracle's. At C = 128 the traced Phase 1 solves by 2 x 2
    blocks (``solve._inverse_diag_kernel``)."""
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "always")
    counter = CompileCounterWithBackend("inductor")

    def call(bank, k_idx, k_val, v, beta, g, q_idx, q_val):
        return sdm_inductor.write_read(bank, k_idx, k_val, v, beta, g, q_idx, q_val,
                                       chunk_size=chunk, slots_per_stream=64)

    fn = torch.compile(call, backend=counter, fullgraph=True, dynamic=True)
    tol = dict(eager=1e-5, oracle=1e-4) if dtype == torch.float32 else dict(eager=1e-2,
                                                                             oracle=2e-2)
    for T, seed in ((70, 41), (149, 42)):
        ins = make_inputs(2, T, W=17, R=5, hd=160, slots_per_stream=64, dtype=dtype,
                          seed=seed, device="cuda")
        args = float_leaves(list(ins))
        dy, dM = torch.randn_like(ins.v), torch.randn_like(ins.bank)

        def step():
            y, M = fn(*args)
            torch.autograd.backward((y, M), (dy, dM))
            return y.detach(), M.detach()

        if T == 70:   # (run_and_get_code resets Dynamo: the first call only)
            (y, M), (fw, bw) = run_and_get_code(step)
            assert "_queue_walk_kernel" in fw and not extern_calls(fw), extern_calls(fw)
            assert "_queue_reverse_kernel" in bw and not extern_calls(bw), extern_calls(bw)
            assert not any(re.search(rf"\b{n}\b", bw) for n in PHASE1_KERNELS)
            if chunk == 128:
                assert re.search(r"\b_inverse_diag_kernel\b", fw), "no blocked solve"
            # each kind of item stays a function of its own (lowerings/kernel_source.py)
            for code, items in ((fw, ("_gather_item", "_mix_item", "_write_item")),
                                (bw, ("_mix1_item", "_dw_item", "_mix2_item", "_dev_item"))):
                for item in items:
                    assert f"@triton.jit(noinline=True)\ndef {item}(" in code, item
        else:
            y, M = step()
        eager = float_leaves(list(ins))
        y_e, M_e = call(*eager)
        torch.autograd.backward((y_e, M_e), (dy, dM))
        errs = {"y": rel_err(y, y_e), "M": rel_err(M, M_e)}
        errs.update({f"grad {n}": rel_err(a.grad, b.grad)
                     for n, a, b in zip(ins._fields, args, eager) if a.requires_grad})
        print(f"T={T}: compiled vs eager", errs)
        assert max(errs.values()) < tol["eager"], (T, errs)
        y_ref, M_ref = sdm_write_read_reference(*[a.detach().cpu().double() if
                                                  a.is_floating_point() else a.cpu()
                                                  for a in ins], compute_dtype=torch.float64)
        errs = rel_err(y.cpu(), y_ref), rel_err(M.cpu(), M_ref)
        assert max(errs) < tol["oracle"], (T, errs)
    assert counter.frame_count == 1


@needs_cuda
@pytest.mark.cuda
@pytest.mark.compile
def test_cuda_emitted_layer_survives_padded_projections(monkeypatch, no_caches):
    """Inductor's ``pad_mm`` pads a matmul whose N is not aligned (the gate projections'
    N = heads = 2) where its benchmark says padding is faster, after the sdm kernels'
    launches were traced: the projection's output becomes a strided slice of the padded
    result. Forced here on every matmul (``force_shape_pad``), the layer's emitted kernels
    read the gates as eager does, at two lengths of one symbolic compilation: they get
    dense copies and strides computed from sizes (``kernels.runtime.launch.dense``,
    ``phase1.entries.gate_strides``). Handing them ``.contiguous()`` inputs and traced
    strides instead must read wrong gates here (the premise: else this test
    could not fail)."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.phase1 import entries
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "always")
    monkeypatch.setattr(torch._inductor.config, "force_shape_pad", True)
    torch.manual_seed(0)
    layer = SparseDeltaMemory(32, num_heads=2, slots_per_head=16, top_k=4, key_dim=8,
                              chunk_size=16).cuda()
    xs = [torch.randn(2, T, 32, device="cuda") for T in (42, 67)]

    def worst_error():
        torch._dynamo.reset()
        fn = torch.compile(layer, dynamic=True)
        with torch.no_grad():
            return max(rel_err(fn(x), layer(x)) for x in xs)

    fixed = worst_error()
    with monkeypatch.context() as m:   # the traced inputs and strides as they were
        m.setattr(host, "dense", lambda x: x.contiguous())
        m.setattr(entries, "gate_strides", lambda x: (x.stride(0), x.stride(2), x.stride(1)))
        before = worst_error()
    print(f"compiled (padded projections) vs eager: rel err {fixed:.1e}, "
          f"with .contiguous() and traced strides {before:.1e}")
    assert before > 1e-3, f"padding did not change the gates' layout ({before:.1e})"
    assert fixed < 1e-5, fixed


@needs_cuda
@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.parametrize("emit", ["aot", "always"])
def test_cuda_graphs_reduce_overhead(emit, monkeypatch, no_caches):
    """CUDA graphs of both forms: the extern call of the eager op (its index checks run in
    the warm-up, not while the graph records) and the emitted column walks."""
    from torch._dynamo.utils import counters
    monkeypatch.setattr(lowering, "EMIT_KERNELS", emit)
    counters.clear()
    fn = torch.compile(gated, fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        for seed in (1, 2, 3):  # warm-up, record, replay
            args = gated_inputs(2, 40, seed=seed, device="cuda")
            y, M = fn(*args)
            y_ref, M_ref = gated_reference([a.cpu() for a in args])
            assert rel_err(y.cpu(), y_ref) < 1e-4 and rel_err(M.cpu(), M_ref) < 1e-4
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@needs_cuda
@pytest.mark.cuda
@pytest.mark.compile
def test_cuda_in_place_api_routes_to_in_place_kernels(monkeypatch, no_caches):
    """``sdm_write_read`` (2.0.0 API) without grad: ``sdm::write_read_`` on the caller's
    bank becomes ``sdm::triton_write_read_`` (kernels emitted); the bank is advanced in
    place."""
    monkeypatch.setattr(lowering, "EMIT_KERNELS", "always")
    ins = make_inputs(2, 40, W=4, R=3, hd=HD, slots_per_stream=SPH, seed=31, device="cuda")

    def step(memory, *rest):
        return sdm_inductor.sdm_write_read(memory, *rest, chunk_size=C, num_memory_slots=SPH,
                                           num_parallel=2)

    fn = torch.compile(step, fullgraph=True)
    m_compiled, m_eager = ins.bank.clone(), ins.bank.clone()
    with torch.no_grad():
        y, (code,) = run_and_get_code(fn, m_compiled, *ins[1:])
        y_eager = step(m_eager, *ins[1:])
    assert not extern_calls(code), extern_calls(code)
    assert any(k in code for k in ("_forward_kernel", "_queue_walk_kernel", "_decode_kernel"))
    assert rel_err(y, y_eager) < 1e-5 and rel_err(m_compiled, m_eager) < 1e-5
    assert not torch.equal(m_compiled, ins.bank)
