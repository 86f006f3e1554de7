"""Pattern rewrites: compile time and step time of a token loop.

    python benchmarks/bench_rewrite.py [--device cpu|cuda] [--T 64 256 1024]
                                       [--plain-timeout 240] [--json out.json]

For each T, one fresh process per measurement (Inductor's caches off, so every compile
is real), no-grad forward:
  - ``dynamo``:   Dynamo alone (``backend="eager"``, rewrites off): its tracing time is
                  the floor of any compile of the unrolled loop.
  - ``plain``:    ``torch.compile`` of the loop with the rewrites off (T copies of the
                  step reach Inductor). Capped by ``--plain-timeout``; reported as such.
  - ``rewrite``:  ``torch.compile`` of the same loop with the rewrites on.
  - ``explicit``: ``torch.compile`` of a call of ``torch.ops.sdm.write_read``.
  - ``scan``:     ``torch.compile`` of the loop written with ``scan`` (rewritten from
                  the body, never unrolled).
Compile time = first call - one steady call. Step time = median of ``--reps`` calls,
each followed by a call of the compiled explicit op; ``vs_explicit`` = ratio of the minima
(a shared CPU makes single calls vary several-fold; the minimum is the machine's floor).
Goals: rewrite compile <= dynamo + 20%; rewrite step = explicit step +-5%;
scan compile flat in T.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = {
    "cpu": dict(S=4096, hd=64, W=16, R=16),
    "cuda": dict(S=65536, hd=128, W=32, R=32),
}
MODES = ("dynamo", "plain", "rewrite", "explicit", "scan")
_OPAQUE = "--opaque-triton" in sys.argv


# ============================================================================ worker

def _loop(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    import torch
    M = M.clone()
    outs = []
    for t in range(k_idx.shape[0]):
        rows = M[k_idx[t]]
        dec = rows * torch.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - (k_val[t][:, None] * dec).sum(0))
        M[k_idx[t]] = dec + k_val[t][:, None] * delta[None, :]
        outs.append((q_val[t][:, None] * M[q_idx[t]]).sum(0))
    return torch.stack(outs), M


def _scan(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    import torch
    from torch._higher_order_ops.scan import scan

    def body(M, x):
        ki, kv, vv, b, gg, qi, qv = x
        dec = M[ki] * torch.exp(gg)[:, None]
        delta = b * (vv - (kv[:, None] * dec).sum(0))
        M = M.index_put((ki,), dec + kv[:, None] * delta[None, :])
        return M, (qv[:, None] * M[qi]).sum(0)

    M, outs = scan(body, M, (k_idx, k_val, v, beta, g, q_idx, q_val))
    return outs, M


def _explicit(M, k_idx, k_val, v, beta, g, q_idx, q_val):
    import torch
    r, final, _, _ = torch.ops.sdm.write_read(M, k_idx[None], k_val[None], v[None], beta[None],
                                              g[None], q_idx[None], q_val[None], 64, 0, False,
                                              "none", False, False)
    return r[0], final


def _inputs(T, device, S, hd, W, R):
    import torch
    gen = torch.Generator().manual_seed(0)
    k_idx = torch.argsort(torch.rand(T, S, generator=gen), dim=-1)[:, :W].contiguous()
    return [t.to(device) for t in (
        torch.randn(S, hd, generator=gen), k_idx, torch.randn(T, W, generator=gen) * 0.3,
        torch.randn(T, hd, generator=gen), torch.rand(T, generator=gen),
        -torch.rand(T, W, generator=gen) * 0.1, torch.randint(0, S, (T, R), generator=gen),
        torch.randn(T, R, generator=gen))]


_WARM = []


def warm_up(dev, sizes):
    """One-time costs of a process are not the compile of this program: Inductor's start
    (C++/Triton toolchain checks, ~30 s on CPU) and the first build of the sdm kernels'
    binaries (on CUDA ~8 s; Triton caches them per (W, R, hd, chunk) specialisation, so a
    user pays it once per cache, like Inductor's start). Paid once on throwaway inputs of
    the measured sizes, for every mode alike; its time is reported as ``warm_up_s``."""
    import torch
    if _WARM:
        return
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.compile(lambda x: x * 2 + 1)(torch.randn(8, device=dev))
        # T=32: past the decode path (T <= 16), so the chunked kernels are built
        torch.compile(_explicit)(*_inputs(32, dev, **sizes))
    torch._dynamo.reset()
    _WARM.append(time.perf_counter() - t0)


def worker(mode: str, T: int, device: str, reps: int) -> dict:
    import torch
    import sdm_inductor  # noqa: F401  (registers the ops and installs the rewrites)
    from sdm_inductor import patterns
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    args = _inputs(T, dev, **SIZES[device])
    warm_up(dev, SIZES[device])
    if mode in ("dynamo", "plain"):
        patterns.disable_rewrites()
    else:
        patterns.enable_rewrites(assume_distinct_write_slots=True)   # argsort slots: distinct
    fn = {"scan": _scan, "explicit": _explicit}.get(mode, _loop)
    compiled = torch.compile(fn, backend="eager" if mode == "dynamo" else "inductor", fullgraph=True)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = compiled(*args)
        sync()
        first = time.perf_counter() - t0
        rep = patterns.last_report()   # before the explicit op's compile replaces it
        # the explicit op, compiled too, timed in alternation with this mode's program so
        # that both see the same machine state (CPU timings here vary several-fold)
        ref_fn = torch.compile(_explicit) if mode != "explicit" else compiled
        ref_fn(*args)
        times, ref_times = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            compiled(*args)
            sync()
            t1 = time.perf_counter()
            ref_fn(*args)
            sync()
            t2 = time.perf_counter()
            times.append(t1 - t0)
            ref_times.append(t2 - t1)
    step = statistics.median(times)
    ref = _explicit(*args) if mode != "explicit" else out
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref))
    return dict(mode=mode, T=T, device=device, compile_s=first - step, step_ms=step * 1e3,
                step_min_ms=min(times) * 1e3, explicit_min_ms=min(ref_times) * 1e3,
                vs_explicit=min(times) / min(ref_times),
                rewritten=[str(x) for x in rep.rewritten] if mode in ("rewrite", "scan") else [],
                max_err_vs_op=err, warm_up_s=_WARM[0])


# ============================================================================ driver

def run_one(mode, T, device, reps, timeout):
    env = dict(os.environ, TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
               TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="sdm_bench_"))
    cmd = [sys.executable, __file__, "--worker", mode, "--T", str(T), "--device", device,
           "--reps", str(reps)] + (["--opaque-triton"] if _OPAQUE else [])
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(mode=mode, T=T, device=device, timeout_s=timeout)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return dict(mode=mode, T=T, device=device, error=(p.stderr or p.stdout)[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if _has_cuda() else "cpu")
    ap.add_argument("--T", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--plain-timeout", type=float, default=240)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--plain-max-T", type=int, default=None,
                    help="measure plain torch.compile only up to this T (it grows fastest)")
    ap.add_argument("--inprocess", action="store_true",
                    help="all measurements in this process (Dynamo reset between them; Inductor's "
                         "caches off): no per-process start, no timeout for plain")
    ap.add_argument("--opaque-triton", action="store_true",
                    help="keep Triton-backed custom ops opaque in compiled graphs (torch._functorch."
                         "config.decompose_custom_triton_ops=False) instead of inlining their kernels")
    ap.add_argument("--json")
    ap.add_argument("--worker")
    a = ap.parse_args()
    if a.opaque_triton:
        import torch._functorch.config as fconfig
        fconfig.decompose_custom_triton_ops = False
    if a.worker:
        print(json.dumps(worker(a.worker, a.T[0], a.device, a.reps)))
        return
    if a.inprocess:
        os.environ.update(TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    results = []
    for T in a.T:
        for mode in a.modes:
            if mode == "plain" and a.plain_max_T is not None and T > a.plain_max_T:
                r = dict(mode=mode, T=T, device=a.device, skipped=f"T > --plain-max-T {a.plain_max_T}")
            elif a.inprocess:
                import torch
                torch._dynamo.reset()
                r = worker(mode, T, a.device, a.reps)
            else:
                r = run_one(mode, T, a.device, a.reps, a.plain_timeout if mode == "plain" else a.timeout)
            results.append(r)
            print(json.dumps(r), flush=True)
    _summary(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


def _has_cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _summary(results):
    by = {(r["mode"], r["T"]): r for r in results}
    Ts = sorted({r["T"] for r in results})
    print("\n   T | mode      | compile s | step ms   | note")
    for T in Ts:
        for mode in MODES:
            r = by.get((mode, T))
            if r is None:
                continue
            if "skipped" in r:
                print(f"{T:5d} | {mode:9s} | skipped ({r['skipped']})")
                continue
            if "timeout_s" in r:
                print(f"{T:5d} | {mode:9s} | > {r['timeout_s']:.0f} s (stopped) |")
                continue
            if "error" in r:
                print(f"{T:5d} | {mode:9s} | error: {r['error'].splitlines()[-1][:80]}")
                continue
            print(f"{T:5d} | {mode:9s} | {r['compile_s']:9.2f} | {r['step_ms']:9.3f} | "
                  f"min {r['step_min_ms']:.3f} = x{r['vs_explicit']:.3f} of the explicit op's min "
                  f"(alternating), err vs op {r['max_err_vs_op']:.1e}")
    print("\nGoals:")
    for T in Ts:
        d, rw = by.get(("dynamo", T)), by.get(("rewrite", T))
        if d and rw and "compile_s" in d and "compile_s" in rw:
            print(f"  T={T}: rewrite compile {rw['compile_s']:.2f} s vs Dynamo tracing {d['compile_s']:.2f} s "
                  f"(x{rw['compile_s'] / max(d['compile_s'], 1e-9):.2f}; goal <= x1.20)")
        if rw and "vs_explicit" in rw:
            print(f"  T={T}: rewrite step min {rw['step_min_ms']:.3f} ms vs explicit op min "
                  f"{rw['explicit_min_ms']:.3f} ms, timed in alternation "
                  f"({100 * (rw['vs_explicit'] - 1):+.1f}%; goal within +-5%)")
    scans = [(T, by[("scan", T)]["compile_s"]) for T in Ts if "compile_s" in by.get(("scan", T), {})]
    if scans:
        print("  scan compile s by T: " + ", ".join(f"T={T}: {c:.2f}" for T, c in scans) + " (goal: flat)")


if __name__ == "__main__":
    main()
