"""Inductor orders, reuses and clones buffers around a user-defined Triton kernel by what its
mutation analysis (``torch._higher_order_ops.triton_kernel_wrap``, on the kernel's TTIR)
says the launch writes. A write the analysis missed would let a compiled graph or an
AOTInductor package read a buffer before the kernel wrote it, or hand a later kernel the
buffer's memory while it is still live: wrong results that depend on the memory plan.

So for every launch of the traced host code (the column and queue walks and the traced Phase 1
forms that compiled graphs and packages launch on CUDA), the analysis, run here on CPU for
an sm_90 target, must list every tensor the launch changes when run under the Triton
interpreter (a subprocess with ``TRITON_INTERPRET=1`` and the traced forms forced).
"""
from __future__ import annotations

import inspect
import json
import os
import sys

import pytest
import torch

pytest.importorskip("triton")

CASES = ("forward", "forward_queue", "forward_gated", "forward_fp8", "backward", "backward_queue",
         "forward_chunk128")
# rough seconds of each case's subprocess on one core (the order of the background queue)
COST = dict(forward=5, forward_queue=11, forward_gated=5, forward_fp8=6, backward=12,
            backward_queue=24, forward_chunk128=12)


def _chunk(case: str) -> int:
    """The case's chunk size: 128 takes the solve's blocked kernels (64 < C <= 128)."""
    return 128 if case == "forward_chunk128" else 16


def _case_inputs(case: str) -> tuple:
    """The case's tensors (real; the analysis half converts them to fake ones)."""
    from sdm_inductor.testing import make_inputs
    # W = 17 takes the queue walks (past ``column_suits``), W = 4 the column walks
    ins = make_inputs(P=2, T=37, W=17 if case.endswith("_queue") else 4, R=3, hd=18,
                      slots_per_stream=24, seed=5)
    gen = torch.Generator().manual_seed(7)
    base = (ins.bank, ins.k_idx, ins.k_val, ins.v, ins.beta, ins.g, ins.q_idx, ins.q_val)
    P, T, hd = ins.v.shape
    if case == "forward_gated":   # b_raw, a_raw, A_log, dt_bias
        return base + (torch.randn(P, T, generator=gen), torch.randn(P, T, generator=gen),
                       torch.randn(P, generator=gen), torch.randn(P, generator=gen))
    if case.startswith("backward"):   # the readings' and the final bank's gradients
        return base + (torch.randn(P, T, hd, generator=gen),
                       torch.randn(*ins.bank.shape, generator=gen))
    return base


def _run_case(case: str, args: tuple, on_inputs=lambda tensors: None):
    """The case's host-code call (``host.forward_kept`` / ``host.backward``), just before
    which ``on_inputs`` gets the tensors that a traced graph of the call takes as inputs
    and does not write (a backward's: also what its forward made and handed over)."""
    from sdm_inductor.kernels import host
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = args[:8]
    C = _chunk(case)
    if not case.startswith("backward"):
        on_inputs(args[1:])   # (not the bank, which a forward writes in place)
    if case in ("forward", "forward_queue", "forward_chunk128"):
        # a training forward, as traced (KEEP)
        return host.forward_kept(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, "none", True)
    if case == "forward_fp8":
        return host.forward_once(bank, k_idx, k_val, v, beta, g, q_idx, q_val, C, "fp8", True)
    if case == "forward_gated":   # the compiled layer's no-grad call (examples/export_aoti.py)
        b_raw, a_raw, A_log, dt_bias = args[8:]
        return host.forward_once(bank, k_idx, k_val, v, host.raw_gate_layout(b_raw),
                                 host.raw_gate_layout(a_raw), q_idx, q_val, C, "none", False,
                                 gate_params=(A_log, dt_bias))
    dy, dM = args[8:]
    final = bank.clone()
    _, rows, scales, kept = host.forward_kept(final, k_idx, k_val, v, beta, g, q_idx, q_val,
                                              C, "none", True)
    on_inputs(list(args[1:]) + [final, rows, scales]
              + (kept.tensors() if case == "backward_queue" else []))
    # the queue walk's backward as a traced graph runs it (what the forward handed over:
    # no gathers, KEPT); the column walk's as a backward called on its own (recomputing)
    return host.backward(dy, dM, final, rows, scales, k_idx, k_val, v, beta, g, q_idx, q_val,
                         C, "none", False, kept.tensors() if case == "backward_queue" else [])


def _kernel_modules():
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.backward import phase1_grads, reverse_walk, sources, step_walk
    from sdm_inductor.kernels.backward import queue_walk as queue_reverse
    from sdm_inductor.kernels.forward import column_walk, decode, quantize, queue_walk
    from sdm_inductor.kernels.phase1 import entries, groups, headers, pairs, solve
    from sdm_inductor.kernels.runtime import launch
    return (launch, host, entries, groups, pairs, headers, solve, column_walk, queue_walk, decode,
            quantize, reverse_walk, queue_reverse, phase1_grads, sources, step_walk)


def _record_launches(on_launch):
    """Route every ``launch`` of the kernel modules to ``on_launch``."""
    for m in _kernel_modules():
        if hasattr(m, "launch"):
            m.launch = on_launch


def _bound(kernel, args, meta) -> dict:
    """The launch's arguments by parameter name (defaults included)."""
    params = inspect.signature(kernel.fn).parameters
    kw = dict(zip(params, args))
    kw.update({k: v for k, v in meta.items() if k in params})
    for name, p in params.items():
        if name not in kw and p.default is not inspect.Parameter.empty:
            kw[name] = p.default
    return kw


def _truth(case: str) -> list:
    """Under the interpreter, with the traced forms forced: (kernel, tensors it changed)."""
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.phase1 import entries, groups, pairs, solve
    from sdm_inductor.kernels.runtime import launch
    for m in (host, entries, groups, pairs, solve):
        m.is_fake = lambda t: True
    launch._is_fake = lambda t: True
    seen = []

    def on_launch(kernel, grid, *args, **meta):
        tensors = {k: v for k, v in _bound(kernel, args, meta).items()
                   if isinstance(v, torch.Tensor)}
        before = {k: v.clone() for k, v in tensors.items()}
        kernel[grid](*args, **meta)
        changed = [k for k, v in tensors.items()
                   if not torch.equal(v.view(torch.uint8), before[k].view(torch.uint8))]
        seen.append((kernel.fn.__name__, sorted(changed)))
    _record_launches(on_launch)
    _run_case(case, _case_inputs(case))
    return seen


def _analysis(case: str) -> list:
    """Traced with fake tensors: (kernel, tensors the mutation analysis says it writes,
    the launch's parameters that hold an input of the traced graph, ``_run_case``)."""
    import triton
    from torch._higher_order_ops import triton_kernel_wrap as tkw
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef

    from sdm_inductor.testing import Sm90Target

    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.backward import dispatch
    from sdm_inductor.kernels.phase1 import solve
    from sdm_inductor.kernels.runtime import launch

    launches, held = [], {}

    def on_inputs(tensors):   # the launches from here on are the traced graph's
        held.update({StorageWeakRef(x.untyped_storage()): len(launches) for x in tensors})

    def dense(x):   # the copy of an input is that input: ``remove_noop_ops`` drops it
        y = launch.dense(x)
        i = held.get(StorageWeakRef(x.untyped_storage()))
        if i is not None:
            held.setdefault(StorageWeakRef(y.untyped_storage()), i)
        return y

    _record_launches(lambda kernel, grid, *args, **meta: launches.append((kernel, args, meta)))
    args = _case_inputs(case)
    modules = (host, dispatch, solve)
    try:
        for m in modules:
            m.dense = dense
        with FakeTensorMode() as mode:
            _run_case(case, tuple(mode.from_tensor(a) for a in args), on_inputs)
    finally:
        for m in modules:
            m.dense = launch.dense
    old = triton.runtime.driver._active
    triton.runtime.driver.set_active(Sm90Target())
    try:
        out = []
        for i, (kernel, args, meta) in enumerate(launches):
            bound = _bound(kernel, args, meta)
            given = sorted(k for k, v in bound.items() if isinstance(v, torch.Tensor)
                           and held.get(StorageWeakRef(v.untyped_storage()), i + 1) <= i)
            kw = {k: torch.empty(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
                  for k, v in bound.items()}
            if hasattr(tkw, "identify_mutated_tensors"):          # torch 2.11
                writes = tkw.identify_mutated_tensors(kernel, kw, {})
            else:                                                  # torch 2.13
                writes = [d.name for d in
                          tkw.identify_accessed_tensors(kernel, kw, {}).read_writes.writes]
            _build_with_constant_scalars(kernel, kw)
            out.append((kernel.fn.__name__, sorted(writes), given))
        return out
    finally:
        triton.runtime.driver._active = old


def _build_with_constant_scalars(kernel, kw: dict) -> None:
    """Build the launch's TTIR as torch 2.11's analysis does, with every non-tensor argument
    a constant (2.13 keeps the non-constexpr ones as arguments). A kernel that fails to build
    that way (a helper reassigning a parameter that a caller passes a scalar argument to, in
    a loop) is analysed on 2.11 as writing every input it takes."""
    import copy

    from torch._higher_order_ops.triton_kernel_wrap import generate_ttir
    fn = copy.copy(kernel)
    fn.params = [copy.copy(p) for p in kernel.params]
    for p in fn.params:
        # (a cached_property: the copy's own value; Triton refuses a constexpr that is
        # also ``do_not_specialize``, which 2.11 passes among its constants without)
        if not isinstance(kw.get(p.name), torch.Tensor) and not p.do_not_specialize:
            p.__dict__["is_constexpr"] = True
    generate_ttir(fn, kw, {})


def _job(item) -> dict:
    """The interpreter half of the case (``tests/conftest.py`` starts it with the session)."""
    # the checkout under test, not whatever an installed sdm_inductor points to
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=root)
    return dict(argv=[sys.executable, __file__, item.callspec.params["case"]], env=env,
                timeout=600, cost=COST[item.callspec.params["case"]], warm=True)


@pytest.mark.background(job=_job)
@pytest.mark.parametrize("case", CASES)
def test_mutation_analysis_lists_every_write_of_the_traced_kernels(case, background, monkeypatch):
    proc = background()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith(TRUTH)]
    truth = [tuple(x) for x in json.loads(line[len(TRUTH):])]
    for m in _kernel_modules():   # the recorder must not outlive the test
        if hasattr(m, "launch"):
            monkeypatch.setattr(m, "launch", m.launch)
    analysis = _analysis(case)
    assert [k for k, *_ in analysis] == [k for k, _ in truth], (analysis, truth)
    assert any(changed for _, changed in truth), "no launch changed anything: nothing checked"
    assert any(given for *_, given in analysis), "no launch takes an input: nothing checked"
    for (kernel, writes, given), (_, changed) in zip(analysis, truth):
        missed = set(changed) - set(writes)
        assert not missed, f"{kernel}: writes {sorted(missed)} that the analysis misses"
        # an input of the traced graph that the analysis lists as written but the launch
        # only reads: Inductor would copy it before every launch (the handed-over plan, the
        # forward's v - r0, the readings' gradient)
        extra = (set(writes) - set(changed)) & set(given)
        assert not extra, f"{kernel}: the analysis lists inputs {sorted(extra)} as written"


TRUTH = "truth: "   # the line of the interpreter half's output that holds its result

if __name__ == "__main__":   # the interpreter half, in its own process
    from sdm_inductor.testing import quick_interpreter
    quick_interpreter()
    print(TRUTH + json.dumps(_truth(sys.argv[1])))
