"""The CUDA implementation's host code, traced with symbolic shapes on CPU (no GPU needed:
``wrap_triton`` records the launches without running them): a graph traced at one
length must serve other lengths without a recompile (a new T needs no new kernel
compilation), which is what a compiled model with ``dynamic=True`` relies on.

A length that is a multiple of the chunk size (no padded tail) is among those asked.
"""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from sdm_inductor.testing import make_inputs

pytest.importorskip("triton")
from sdm_inductor.kernels import host  # noqa: E402

C = 16


def _inputs(T, W=4):
    ins = make_inputs(P=2, T=T, W=W, R=3, hd=18, slots_per_stream=24, seed=T)
    return (ins.bank, ins.k_idx, ins.k_val, ins.v, ins.beta, ins.g, ins.q_idx, ins.q_val)


def _wide_inputs(T):   # W = 17: past ``column_suits``, so a traced call takes the queue walk
    return _inputs(T, W=17)


def _forward(bank, *rest):
    return host.forward_once(bank, *rest, C, "none", True)


def _forward_fp8(bank, *rest):   # the scaled log: packed by its own kernel
    return host.forward_once(bank, *rest, C, "fp8", True)


def _backward(dy, dM, final, rows, scales, *rest):
    return host.backward(dy, dM, final, rows, scales, *rest, C, "none", False)


def _backward_args(T, W=4):
    bank, *rest = _inputs(T, W)
    log = torch.randn(-(-T // C) * 2 * C, W, bank.shape[1])   # the undo log
    return (torch.randn(2, T, bank.shape[1]), torch.randn_like(bank), bank, log, torch.empty(0),
            *rest)


def _wide_backward_args(T):
    return _backward_args(T, W=17)


def _training(bank, k_idx, k_val, v, beta, g, q_idx, q_val, dy, dM):
    """A training call as a compiled graph runs it: the forward keeps its Phase 1 and
    ``v - r0`` (``Kept``) and hands them to the backward."""
    from sdm_inductor.kernels.backward import dispatch
    final = bank.clone()
    y, rows, scales, keep = host.forward_kept(final, k_idx, k_val, v, beta, g, q_idx, q_val, C,
                                              "none", True, keep=True)
    grads = dispatch.backward(dy, dM, final, rows, scales, k_idx, k_val, v, beta, g, q_idx,
                              q_val, C, "none", False, host.CONFIG, keep.tensors())
    return (y, final, *grads)


def _training_args(T, W=17):
    bank, *rest = _inputs(T, W)
    return (bank, *rest, torch.randn(2, T, bank.shape[1]), torch.randn_like(bank))


def _inductor_view_passes(gm):
    """Inductor's joint-graph patterns on ``gm``, as a compile runs them: its pointless-view
    rules compare a view's sizes with its input's (``definitely_equal``), which guards on
    the comparison, so a [B, C] view of a [P, Tp] tensor would guard on ``B == P`` (one
    chunk) there even where tracing did not."""
    from torch._inductor.fx_passes import joint_graph
    from torch._inductor.virtualized import V
    fake_mode = next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder").fake_mode
    with V.set_fake_mode(fake_mode):
        if hasattr(joint_graph, "lazy_init"):
            joint_graph.lazy_init()
        joint_graph.early_patterns.apply(gm.graph)
        joint_graph.patterns.apply(gm.graph)


@pytest.mark.parametrize("traced_T", [37, 9])
@pytest.mark.parametrize("which", ["forward", "forward_queue", "forward_fp8", "backward",
                                   "backward_queue", "training"])
def test_traced_host_code_serves_other_lengths(which, traced_T):
    """(``P`` is symbolic too: the walk is chosen by its example value, with no guard.)
    Traced at one chunk (``traced_T`` = 9 < C) too: no shape of the traced code may have a
    dimension of the chunk count alone, or a view that asks whether it is 1, in tracing or
    in Inductor's view passes."""
    fn, make = {"forward": (_forward, _inputs), "forward_queue": (_forward, _wide_inputs),
                "forward_fp8": (_forward_fp8, _inputs),
                "backward": (_backward, _backward_args),
                "backward_queue": (_backward, _wide_backward_args),
                "training": (_training, _training_args)}[which]
    gm = make_fx(fn, tracing_mode="symbolic")(*make(traced_T))
    _inductor_view_passes(gm)
    launches = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert launches, "no kernel launch was traced"
    # a traced call takes single-launch walks (column or queue), never the per-chunk step walks
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    names = {kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__ for n in launches}
    want = {"forward": {"_forward_kernel"}, "forward_queue": {"_queue_walk_kernel"},
            "forward_fp8": {"_forward_kernel", "_quantize_kernel"},
            "backward": {"_reverse_kernel"}, "backward_queue": {"_queue_reverse_kernel"},
            "training": {"_queue_walk_kernel", "_queue_reverse_kernel"}}[which]
    assert want <= names, names
    assert not any(name.startswith("_step") for name in names), names
    fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    shape_env = fakes[0].fake_mode.shape_env
    for T in (9, 37, 48, 53, 101, 250):
        assert shape_env.evaluate_guards_for_args(fakes, list(make(T))), (
            f"the {which} traced at T={traced_T} would recompile for T={T}: "
            + "; ".join(str(g.expr) for g in shape_env.guards))


def test_eager_implementations_launch_without_the_hop():
    """The eager implementations switch ``wrap_triton`` off for real tensors (each launch
    through the higher-order op costs ~100 us of host time) and keep it for traced ones."""
    from torch._library.triton import is_wrap_triton_enabled
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sdm_inductor.kernels.runtime.launch import direct_launches

    seen = []
    probe = direct_launches(lambda x: seen.append(is_wrap_triton_enabled()))
    probe(torch.zeros(2))
    with FakeTensorMode() as mode:
        probe(mode.from_tensor(torch.zeros(2)))
    assert seen == [False, True]
    assert is_wrap_triton_enabled()
    for name in ("forward", "forward_gated", "backward"):
        assert getattr(host, name).__wrapped__ is not None, name


def _sorts(mode):
    """The rank and dtype of each tensor ``_forward`` sorts, traced with ``tracing_mode=mode``."""
    gm = make_fx(_forward, tracing_mode=mode)(*_inputs(37))
    sorts = (torch.ops.aten.sort.stable, torch.ops.aten.sort.default)
    return [(len(v.shape), v.dtype) for n in gm.graph.nodes if n.target in sorts
            for v in [n.args[0].meta["val"]]]


def test_phase1_sorts_all_segments_at_once_where_its_keys_allow():
    """Phase 1 sorts every segment's keys in one flat sort (``phase1.entries.FLAT_SORT``),
    int32 keys where they fit, wherever the offset keys fit their dtype. With symbolic
    sizes (a compiled graph) both are guards, which the sizes of other calls must pass
    too, so a graph traced with symbolic sizes sorts as a static one; an AOTInductor
    package, which has no guards, takes only what its shapes prove (unbounded sizes: int64
    keys sorted per segment)."""
    from torch._dynamo.source import ConstantSource
    from torch._inductor.virtualized import V
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from sdm_inductor.kernels.phase1 import entries

    assert _sorts("fake") == [(1, torch.int32)]
    assert _sorts("symbolic") == [(1, torch.int32)]
    env = ShapeEnv()
    sym = lambda name, hint: env.create_symintnode(env.create_symbol(hint, ConstantSource(name)),
                                                   hint=hint)
    B, S = sym("B", 8), sym("S", 600)
    E = 7
    with V.set_aot_compilation(True):
        assert entries._key_dtype(S, C, E) == torch.int64
        assert entries._flat_span(S, B, C, E) is None
        assert entries._flat_span(600, B, C, E) is None
    assert not env.guards
    assert entries._key_dtype(S, C, E) == torch.int32
    assert entries._flat_span(S, B, C, E) == 2 * (S + C * E)
    assert {str(g.expr) for g in env.guards} == {str(S + C * E < 2 ** 30),
                                                 str(B * (2 * (S + C * E)) < 2 ** 31)}
    # concrete sizes: int32 keys offset where they fit, else per segment; int64 keys (a
    # bank past int32 keys) offset while they fit int64
    assert entries._flat_span(600, 8, C, E) == 2 * (600 + C * E)
    assert entries._flat_span(2 ** 29, 8, C, E) is None
    assert entries._flat_span(2 ** 31, 8, C, E) == 2 * (2 ** 31 + C * E)
    assert entries._flat_span(2 ** 40, 2 ** 22, C, E) is None


def test_traced_phase1_takes_the_eager_kernel_forms():
    """Traced calls launch Phase 1 as eager calls do: the split pairs kernel (two programs
    per token reading the groups' sorted members) and the groups in blocks of positions."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    gm = make_fx(_forward, tracing_mode="symbolic")(*_inputs(37))
    seen = {}
    for n in gm.graph.nodes:
        if "triton_kernel_wrapper" in str(n.target):
            name = kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
            seen[name] = {**n.kwargs["kwargs"],
                          **kernel_side_table.get_constant_args(n.kwargs["constant_args_idx"])}
    assert seen["_pairs_kernel"]["SPLIT"] is True
    assert {"_block_writes_kernel", "_group_bounds_kernel", "_group_sizes_kernel"} <= set(seen)


def _gated_forward(bank, k_idx, k_val, v, b_raw, a_raw, q_idx, q_val, A_log, dt_bias):
    return host.forward_once(bank, k_idx, k_val, v, b_raw, a_raw, q_idx, q_val, C, "none",
                             False, gate_params=(A_log, dt_bias))


def _gated_inputs(T):
    bank, k_idx, k_val, v, _, _, q_idx, q_val = _inputs(T)
    proj = torch.randn(1, T, 2 * 2 + 3)             # [B, T, ...], P = 2 streams: 2 heads
    return (bank, k_idx, k_val, v, proj[..., :2], torch.randn(1, T, 2), q_idx, q_val,
            torch.zeros(2), torch.zeros(2))


_VIEWS = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
          torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
          torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim,
          torch.ops.aten.expand.default, torch.ops.aten.permute.default,
          torch.ops.aten.transpose.int, torch.ops.aten.alias.default,
          torch.ops.aten.as_strided.default}


def _base(node):
    while node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node


def _uses_strides(node) -> bool:
    """Whether the integer ``node`` is computed from a traced tensor's strides."""
    if not isinstance(node, torch.fx.Node):
        return False
    if node.target is torch.ops.aten.sym_stride.int:
        return True
    if node.op != "call_function" or isinstance(node.meta.get("val"), torch.Tensor):
        return False
    return any(_uses_strides(a) for a in node.args)


# the caller's tensors that a kernel only reads (the bank, the log and the final bank are
# written or made by the op itself: the triton_op bodies clone the bank)
_READ = {"gated": (1, 2, 3, 4, 5, 6, 7, 8, 9), "forward": (1, 2, 3, 4, 5, 6, 7),
         "backward": (0, 5, 6, 7, 8, 9, 10, 11)}


@pytest.mark.parametrize("which", ["gated", "forward", "backward"])
def test_traced_kernels_take_dense_copies_and_no_traced_strides(which):
    """Inductor's passes run after tracing and may change how an input of a kernel is laid
    out: ``pad_mm`` pads a small projection (a gate's N = heads) when its benchmark says
    padded is faster, and the projection's output becomes a strided slice of the padded
    result. So a traced call hands its kernels a copy of each input (``launch.dense``;
    ``remove_noop_ops`` drops it where the input stays contiguous) rather than a
    ``.contiguous()`` that leaves no node, and computes the strides it passes from sizes:
    a traced ``stride()`` is a ``sym_stride`` node, evaluated on the changed layout while
    the kernel gets another (without that, AOTInductor CUDA packages of
    ``examples/export_aoti.py`` read wrong gates in 3 of 20 builds, relative error ~1e-2)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    fn, args = {"gated": (_gated_forward, _gated_inputs(37)),
                "forward": (_forward, _inputs(37)),
                "backward": (_backward, _backward_args(37))}[which]
    gm = make_fx(fn, tracing_mode="symbolic")(*args)
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    read = {inputs[i] for i in _READ[which]}
    launches = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert launches, "no kernel launch was traced"
    for n in launches:
        name = kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
        for arg, value in n.kwargs["kwargs"].items():
            assert not _uses_strides(value), (name, arg, "computed from a traced stride")
            if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"),
                                                                torch.Tensor):
                assert _base(value) not in read, (name, arg, "the caller's tensor itself")
    if which == "gated":
        prep = next(n for n in launches if kernel_side_table.get_kernel(
            n.kwargs["kernel_idx"]).fn.__name__ == "_prep_kernel")
        for name in ("beta_ptr", "g_ptr"):
            t = prep.kwargs["kwargs"][name].meta["val"]
            assert t.is_contiguous(), (name, t.shape, t.stride())


def test_auto_walk_rule_and_its_boundaries():
    """``WALK="auto"`` on an eager call: the column walks exactly where ``column_suits``
    holds (W, R <= 16, P * hd <= 4096, C <= 64), the step walks one past each bound;
    "step" / "column" force theirs; a traced (fake) call takes the queue walk, or the column
    walk where ``column_suits`` holds (a symbolic P by its example value, an unbacked one
    never)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sdm_inductor.kernels.runtime.launch import column_suits, step_walks
    bank = torch.empty(8, 128)   # hd = 128
    auto, step, column = ({"WALK": w} for w in ("auto", "step", "column"))
    assert column_suits(32, 16, 16, 64, 128)                  # P * hd = 4096
    for P, W, R, C in ((33, 16, 16, 64), (32, 17, 16, 64), (32, 16, 17, 64), (32, 16, 16, 65)):
        assert not column_suits(P, W, R, C, 128), (P, W, R, C)
        assert step_walks(auto, bank, (P, W, R, C))
    assert not step_walks(auto, bank, (32, 16, 16, 64))
    assert step_walks(step, bank, (32, 16, 16, 64))
    assert not step_walks(column, bank, (2, 64, 64, 128))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(bank)
        assert not step_walks(auto, fake, (2, 64, 64, 128))
        assert host.walk_kind(128, fake, 2, 64, 64) == "queue"
        assert host.walk_kind(64, fake, 32, 16, 16) == "column"
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    P = ShapeEnv().create_unbacked_symint()
    assert not column_suits(P, 16, 16, 64, 128)


def test_queue_walk_refuses_more_items_than_its_int32_tickets():
    """The queue walk's tickets are int32: a call with 2**31 items or more is refused
    before its launch (a guard when the length is symbolic), never run with a wrapped
    ticket count."""
    from types import SimpleNamespace

    from sdm_inductor.kernels.forward.queue_walk import queue_walk
    bank = torch.empty(8, 128, device="meta")
    pl = SimpleNamespace(P=2, C=16, W=64, R=64, NC=2 ** 27, T=2 ** 31)   # 32 items a chunk
    with pytest.raises(RuntimeError, match="int32 tickets"):
        queue_walk(bank, pl, None, None, None, False, host.CONFIG, "tf32")
    pl.NC = 2 ** 26 - 1   # 2**31 - 32 items: past the check (the launch then needs a plan)
    with pytest.raises(AttributeError, match="runs"):
        queue_walk(bank, pl, None, None, None, False, host.CONFIG, "tf32")


def test_traced_walks_know_when_rows_are_16_aligned():
    """Inductor marks a symbolic size divisible by 16 only where it can prove it; a row
    gather of unknown alignment then loads one element at a time. A traced walk takes
    ``HD16`` / ``WIDTH16`` from its row lengths, guarded on, so the graph traced at a
    multiple of 16 serves the other multiples and not the rest (and the other way round)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    def traced(fn, hd):
        ins = make_inputs(P=2, T=37, W=17, R=3, hd=hd, slots_per_stream=24, seed=hd)
        args = (ins.bank, ins.k_idx, ins.k_val, ins.v, ins.beta, ins.g, ins.q_idx, ins.q_val)
        if fn is _backward:
            log = torch.randn(3 * 2 * C, 17, hd)
            args = (torch.randn(2, 37, hd), torch.randn_like(ins.bank), ins.bank, log,
                    torch.empty(0), *args[1:])
        return args, make_fx(fn, tracing_mode="symbolic")(*args)

    for fn, kernel in ((_forward, "_queue_walk_kernel"), (_backward, "_queue_reverse_kernel")):
        for hd, others in ((32, {64: True, 40: False}), (18, {40: True, 64: False})):
            args, gm = traced(fn, hd)
            flags = [n.kwargs["kwargs"] for n in gm.graph.nodes
                     if "triton_kernel_wrapper" in str(n.target)
                     and kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
                     == kernel]
            assert flags and all(f["HD16"] == (hd == 32) for f in flags), (kernel, hd, flags)
            if fn is _backward:
                assert all(f["WIDTH16"] == (hd == 32) for f in flags), (hd, flags)
            fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
            env = fakes[0].fake_mode.shape_env
            for other, served in others.items():
                assert env.evaluate_guards_for_args(fakes, list(traced(fn, other)[0])) == served, (
                    kernel, hd, other)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_traced_queue_walks_carry_their_register_caps(dtype):
    """A traced queue walk's register cap is its launch's one autotune ``Config``, which
    Inductor's output code compiles with (a ``maxnreg`` launch argument would not reach it):
    2-byte banks take ``MAXNREG_QUEUE`` / ``MAXNREG_QUEUE_B``, fp32 banks no cap."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    def caps(fn, args):
        gm = make_fx(fn, tracing_mode="symbolic")(*args)
        found = {}
        for n in gm.graph.nodes:
            if "triton_kernel_wrapper" in str(n.target):
                k = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
                found[k.fn.__name__] = {c.maxnreg for c in getattr(k, "configs", [None]) if c}
        return found

    def cast(args, at):   # the tensors at these positions (banks, values, gradients) in dtype
        return tuple(a.to(dtype) if i in at else a for i, a in enumerate(args))

    bf16 = dtype == torch.bfloat16
    fwd = caps(_forward, cast(_wide_inputs(37), (0, 3)))["_queue_walk_kernel"]
    # dy, dM, the final bank, the undo log, then the forward's inputs (v at 7)
    bwd = caps(_backward, cast(_wide_backward_args(37), (0, 1, 2, 3, 7)))["_queue_reverse_kernel"]
    assert fwd == ({host.CONFIG["MAXNREG_QUEUE"]} if bf16 else {None}), fwd
    assert bwd == ({host.CONFIG["MAXNREG_QUEUE_B"]} if bf16 else {None}), bwd
