"""What users call, timed beside the raw kernels and the floor, in one process (CUDA).

    python benchmarks/bench_user.py [--configs A,B] [--chunks 64,128] [--no-compile]
        [--no-layer] [--no-aoti] [--json out.json]

Rows per config and chunk size, no-grad forward and forward + backward (bf16, index
checks on, as a user runs them):

- ``raw kernels``: ``torch.ops.sdm.triton_write_read_`` (in place) / ``triton_write_read`` +
  ``triton_write_read_backward`` (no argument or index checks, no autograd);
- ``raw functional``: ``torch.ops.sdm.triton_write_read`` saving nothing: the raw kernels
  plus the copy of the bank that a functional call returns (the baseline of the
  functional rows: ``write_read``, ``compiled write_read``);
- ``op``: ``torch.ops.sdm.write_read_`` (no grad) / ``torch.ops.sdm.write_read`` under
  autograd;
- ``sdm_write_read``: the 2.0.0 interface on flat ``[P*T, *]`` inputs;
- ``write_read``: the functional form;
- ``compiled write_read``: ``torch.compile(fullgraph=True)`` of a function calling it
  (the op an extern call of the eager implementation, torch.compile's default on CUDA);
- ``compiled, emitted``: the same with the SDM kernels in the output code
  (``EMIT_KERNELS="always"``: Phase 1 as traced and the queue walks, what AOTInductor
  packages launch);
- ``dynamic, emitted``: the same compiled with ``dynamic=True`` (every size symbolic: the
  walks learn that rows are 16-aligned from a guard, ``runtime.launch.multiple_of_16``);
- ``AOTI package, emitted`` / ``AOTI package, eager op``: an AOTInductor package of a
  module calling ``torch.ops.sdm.write_read`` (no grad; static shapes), built with the SDM
  kernels in it (``EMIT_KERNELS="aot"``, the default) and with the eager op called through
  the proxy executor (``"never"``), run through ``aoti_load_package`` in this process;
- ``layer`` / ``compiled layer``: ``SparseDeltaMemory`` sized like the config
  (``B = P`` streams of one head each, ``slots_per_head = sph``, ``top_k = W``).

Each figure is the median of ``triton.testing.do_bench`` (back-to-back calls). The
floor is the time the necessary row traffic takes at the measured copy bandwidth
(``bench_cuda.floors``). The last columns give each call over its raw baseline: the
functional calls over ``raw functional``, every other call over ``raw kernels``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile

import torch

import sdm_inductor
from sdm_inductor.lowerings import write_read as lowering
from sdm_inductor.nn import SparseDeltaMemory
from sdm_inductor.testing import FunctionalWriteRead

from bench_cuda import CONFIGS, bench, copy_bandwidth, floors, make_inputs


def _leaves(*xs):
    return [x.detach().clone().requires_grad_() for x in xs]


def _clear(leaves):
    for x in leaves:
        x.grad = None


def _time_calls(name: str, C: int, calls: dict) -> dict:
    """label -> (no-grad ms, fwd+bwd ms); a call that fails is reported as NaN and the
    table goes on (one broken row must not cost the run the others)."""
    out = {}
    for label, (nograd, fb) in calls.items():
        try:
            out[label] = (bench(nograd), bench(fb, rep=200) if fb else math.nan)
        except Exception as e:  # noqa: BLE001
            print(f"{name} C={C} {label}: failed: {type(e).__name__}: {e}", flush=True)
            out[label] = (math.nan, math.nan)
        print(f"{name} C={C} {label:<22} no-grad {out[label][0]:7.3f} ms  fwd+bwd "
              f"{out[label][1]:7.3f} ms", flush=True)
    return out


@contextlib.contextmanager
def emit_kernels(mode: str):
    """``lowerings.write_read.EMIT_KERNELS`` set to ``mode`` inside the block."""
    old, lowering.EMIT_KERNELS = lowering.EMIT_KERNELS, mode
    try:
        yield
    finally:
        lowering.EMIT_KERNELS = old


def emitting(run):
    """A timed call (forward, or forward and backward) run with ``EMIT_KERNELS="always"``:
    the forward graph is lowered at the first call, the backward graph lazily at the first
    backward (static shapes), so the whole step runs inside the setting."""
    def call():
        with emit_kernels("always"):
            return run()
    return call


def op_rows(name: str, C: int, compile_: bool) -> dict:
    """(no-grad ms, fwd+bwd ms) of each op-level call at one config and chunk size."""
    cfg = CONFIGS[name]
    ins = make_inputs(**cfg)
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = ins
    P, T, _ = k_idx.shape
    sph = cfg["sph"]
    rest = (k_idx, k_val, v, beta, g, q_idx, q_val)
    work = bank.clone()
    dy = torch.randn_like(v)
    dM = torch.randn_like(bank)
    lv = _leaves(bank, k_val, v, beta, g, q_val)
    flat = [x.reshape(P * T, *x.shape[2:]) for x in rest]
    fbeta = beta.reshape(P * T, 1)   # the 2.0.0 layout: beta [P*T, 1]
    fg = g.reshape(P * T, -1)

    def raw_fb():
        # nothing handed over: the backward recomputes Phase 1 and v - r0
        y, M, r, s, _ = torch.ops.sdm.triton_write_read(bank, *rest, C, "none", True)
        torch.ops.sdm.triton_write_read_backward(dy, dM, M, r, s, *rest, C, "none", False, [])

    def op_fb():
        lb, lk, lvv, lbeta, lg, lq = lv
        y, M, _, _ = torch.ops.sdm.write_read(lb, k_idx, lk, lvv, lbeta, lg, q_idx, lq, C, sph,
                                              False, "none")
        torch.autograd.backward((y, M), (dy, dM))
        _clear(lv)

    def sdm_nograd():
        with torch.no_grad():
            sdm_inductor.sdm_write_read(work, flat[0], flat[1], flat[2], fbeta, fg, flat[5],
                                        flat[6], chunk_size=C, num_memory_slots=sph,
                                        num_parallel=P)

    def sdm_fb():
        lb, lk, lvv, lbeta, lg, lq = lv
        mem = lb.clone()   # the 2.0.0 API advances its memory argument in place
        y = sdm_inductor.sdm_write_read(
            mem, flat[0], lk.reshape(P * T, -1), lvv.reshape(P * T, -1),
            lbeta.reshape(P * T, 1), lg.reshape(P * T, -1), flat[5], lq.reshape(P * T, -1),
            chunk_size=C, num_memory_slots=sph, num_parallel=P)
        y.backward(dy.reshape(P * T, -1))
        _clear(lv)

    def fn(b, *a):
        return sdm_inductor.write_read(b, *a, chunk_size=C, slots_per_stream=sph)

    def fn_emitted(b, *a):   # a code object of its own: Dynamo caches per code object
        return sdm_inductor.write_read(b, *a, chunk_size=C, slots_per_stream=sph)

    def fn_dynamic(b, *a):
        return sdm_inductor.write_read(b, *a, chunk_size=C, slots_per_stream=sph)

    def functional(f):
        def nograd():
            with torch.no_grad():
                f(bank, *rest)

        def fb():
            lb, lk, lvv, lbeta, lg, lq = lv
            y, M = f(lb, k_idx, lk, lvv, lbeta, lg, q_idx, lq)
            torch.autograd.backward((y, M), (dy, dM))
            _clear(lv)
        return nograd, fb

    calls = {
        "raw kernels": (lambda: torch.ops.sdm.triton_write_read_(work, *rest, C), raw_fb),
        "raw functional": (lambda: torch.ops.sdm.triton_write_read(bank, *rest, C, "none", False),
                           raw_fb),
        "op": (lambda: torch.ops.sdm.write_read_(work, *rest, C, sph, False), op_fb),
        "sdm_write_read": (sdm_nograd, sdm_fb),
        "write_read": functional(fn),
    }
    if compile_:
        calls["compiled write_read"] = functional(torch.compile(fn, fullgraph=True))
        calls["compiled, emitted"] = tuple(
            map(emitting, functional(torch.compile(fn_emitted, fullgraph=True))))
        calls["dynamic, emitted"] = tuple(
            map(emitting, functional(torch.compile(fn_dynamic, fullgraph=True, dynamic=True))))
    out = _time_calls(name, C, calls)
    out["floor"] = (lambda f: (f["fwd"], f["fwdbwd"]))(floors(ins, C, BW))
    return out


def aoti_rows(name: str, C: int) -> dict:
    """No-grad calls of AOTInductor packages of the functional op, built with the kernels
    emitted and with the eager op called (fwd+bwd: NaN, a package is a forward)."""
    cfg = CONFIGS[name]
    ins = make_inputs(**cfg)
    mod = FunctionalWriteRead(C, cfg["sph"])
    calls = {}
    for label, emit in (("AOTI package, emitted", "aot"), ("AOTI package, eager op", "never")):
        try:
            with emit_kernels(emit), torch.no_grad(), tempfile.TemporaryDirectory() as d:
                ep = torch.export.export(mod, tuple(ins))
                runner = torch._inductor.aoti_load_package(
                    torch._inductor.aoti_compile_and_package(ep, package_path=f"{d}/p.pt2"))
            calls[label] = (lambda r=runner: r(*ins), None)
        except Exception as e:  # noqa: BLE001
            print(f"{name} C={C} {label}: build failed: {type(e).__name__}: {e}", flush=True)
    return _time_calls(name, C, calls)


def layer_rows(name: str, C: int, compile_: bool) -> dict:
    """The layer sized like a config: one head per stream, the config's bank per head."""
    cfg = CONFIGS[name]
    hd, sph, W = cfg["hd"], cfg["sph"], cfg["W"]
    torch.manual_seed(0)
    layer = SparseDeltaMemory(hd, num_heads=1, slots_per_head=sph, top_k=W, chunk_size=C).to(
        device="cuda", dtype=torch.bfloat16)
    x = torch.randn(cfg["P"], cfg["T"], hd, device="cuda", dtype=torch.bfloat16)
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)

    def wrap(m):
        def nograd():
            with torch.no_grad():
                m(x)

        def fb():
            m(xg).backward(dy)
            layer.zero_grad(set_to_none=True)
            xg.grad = None
        return nograd, fb

    calls = {"layer": wrap(layer)}
    if compile_:
        calls["compiled layer"] = wrap(torch.compile(layer, fullgraph=True))
    return _time_calls(name, C, calls)


FUNCTIONAL = ("write_read", "compiled write_read", "compiled, emitted", "dynamic, emitted",
              "AOTI package, emitted", "AOTI package, eager op")


def table(results: dict):
    print("\n| config | C | call | no-grad ms | fwd+bwd ms | no-grad / raw | fwd+bwd / raw |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, C), rows in results.items():
        for label, (a, b) in rows.items():
            raw = rows["raw functional" if label in FUNCTIONAL else "raw kernels"]
            print(f"| {name} | {C} | {label} | {a:.2f} | {b:.2f} | {a / raw[0]:.2f} | "
                  f"{b / raw[1]:.2f} |")


def main():
    global BW
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--chunks", default="64,128")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-layer", action="store_true")
    ap.add_argument("--no-aoti", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    BW = copy_bandwidth()
    print(f"device-to-device copy: {BW / 1e12:.2f} TB/s")
    results = {}
    for name in args.configs.split(","):
        for C in (int(c) for c in args.chunks.split(",")):
            # each shape compiled afresh, as a program at one shape compiles: a second
            # compile of the same function would take dynamic shapes (automatic dynamic)
            torch._dynamo.reset()
            rows = op_rows(name, C, not args.no_compile)
            if not args.no_aoti:
                rows.update(aoti_rows(name, C))
            if not args.no_layer:
                rows.update(layer_rows(name, C, not args.no_compile))
            results[(name, C)] = rows
            torch.cuda.empty_cache()
    table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{n} C={c}": r for (n, c), r in results.items()}, f, indent=1)


BW = math.nan

if __name__ == "__main__":
    main()
