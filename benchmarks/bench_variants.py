"""Kernel variants of the column walk, one process, same inputs (issue 3, NOTES.md):

    python benchmarks/bench_variants.py [--config A] [--chunk 64] [--tiny]

Each variant is a set of ``kernels.host.CONFIG`` overrides. For each: the no-grad
forward (the eager op's path, windows included) and forward + backward times (medians of
``triton.testing.do_bench``), and its readings, final bank and six gradients against
the first variant's (the kernel measured before) as relative errors, so a faster variant
that computes something else shows at once. ``--tiny`` runs a small config (on CPU under
``TRITON_INTERPRET=1``: a check of this script and of every variant's logic).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_cuda import CONFIGS, make_inputs as cuda_inputs  # noqa: E402

import sdm_inductor  # noqa: E402,F401
from sdm_inductor.kernels import host, phase1  # noqa: E402

key_dtype = phase1._key_dtype


def key_dtype_int64(S, C, E):
    return torch.int64

SESSION2 = dict(WALK="column", NG=512, KW=1, ROWS_AHEAD=0, HEAD_AHEAD=0, NG_BWD=512, KW_BWD=1, EW=16, AHEAD_BWD=0,
                BWD_WINDOWS=1)
NEW = dict(WALK="column", NG=256, KW=4, ROWS_AHEAD=1, HEAD_AHEAD=1, NG_BWD=256, KW_BWD=4, EW=16, AHEAD_BWD=1,
           BWD_WINDOWS=4)
SESSION4 = dict(NEW, PHASE1="search")
STEP = dict(NEW, WALK="step", BD_STEP=128, WARPS_STEP=4, MB_STEP=32, BD_STEP_W=64, NG_STEP=32,
            KW_STEP=2, WARPS_STEP_W=8, MIX_STEP=0, MB_MIX=32, BD_STEP_B=64, MB_MIX_B=32)
VARIANTS = [
    ("session 4 default: Phase 1 by searches, int64 keys", SESSION4),
    ("session 5 default: Phase 1 by scans, int32 keys", NEW),
    ("session 2 kernels", SESSION2),
    ("inline members (KW=4), rows + headers ahead, bwd rows ahead", NEW),
    ("  ... gather tiles EW=8", dict(NEW, EW=8)),
    ("  ... write tiles NG=512 / bwd NG=128", dict(NEW, NG=512, NG_BWD=128)),
    ("  ... no rows ahead (fwd or bwd)", dict(NEW, ROWS_AHEAD=0, AHEAD_BWD=0)),
    ("  ... no headers ahead", dict(NEW, HEAD_AHEAD=0)),
    ("  ... bwd saved-row tiles EW_BWD=4", dict(NEW, EW_BWD=4)),
    ("  ... backward in one window (BWD_WINDOWS=1)", dict(NEW, BWD_WINDOWS=1)),
    ("session 2 + pipeliner GATHER_STAGES=3", dict(SESSION2, GATHER_STAGES=3)),
    # 11-: the step walks (step.py / step_backward.py: launches per chunk over the GPU)
    ("step walks (gather BD 128, 4 warps; mix MB 32; write BD 64, NG 32, KW 2, 8 warps; "
     "bwd rows BD 64, products MB 32)", STEP),
    ("  ... gather 8 warps", dict(STEP, WARPS_STEP=8)),
    ("  ... mix in the last gather program (MIX_STEP=1)", dict(STEP, MIX_STEP=1)),
    ("  ... bwd rows BD=128", dict(STEP, BD_STEP_B=128)),
    ("  ... bwd rows BD=32", dict(STEP, BD_STEP_B=32)),
    ("  ... bwd products MB=64", dict(STEP, MB_MIX_B=64)),
    ("  ... write / restore / dB tiles NG=64", dict(STEP, NG_STEP=64)),
    ("  ... write / restore / dB BD=128", dict(STEP, BD_STEP_W=128)),
    # 19-: session 7, on the package defaults (step walks; token windows with Phase 1 of
    # the next window on a side stream, pipeline.py)
    ("session 7 default: step walks, one training window, no-grad windows of 4096, PDL",
     dict(WALK="step")),
    ("  ... training and no-grad windows of 2048, Phase 1 ahead",
     dict(WALK="step", TRAIN_WINDOW_TOKENS=2048, WINDOW_TOKENS=2048)),
    ("  ... the same, Phase 1 on the walk's stream (PLAN_AHEAD=0)",
     dict(WALK="step", TRAIN_WINDOW_TOKENS=2048, WINDOW_TOKENS=2048, PLAN_AHEAD=0)),
    ("  ... training windows of 4096, Phase 1 ahead", dict(WALK="step", TRAIN_WINDOW_TOKENS=4096)),
    ("  ... no-grad in one window", dict(WALK="step", WINDOW_TOKENS=1 << 20)),
    ("  ... without programmatic dependent launch (PDL=0)", dict(WALK="step", PDL=0)),
    ("  ... bwd row passes BD 64", dict(WALK="step", BD_STEP_B=64)),
    ("  ... write / restore / dB tiles NG 16", dict(WALK="step", NG_STEP=16)),
    ("  ... write / restore / dB inline members KW 1", dict(WALK="step", KW_STEP=1)),
    ("  ... write / restore / dB inline members KW 4", dict(WALK="step", KW_STEP=4)),
]


def make_inputs(P, T, hd, sph, W, R, dev, dtype):
    gen = torch.Generator().manual_seed(0)
    base = (torch.arange(P) * sph).view(P, 1, 1)
    k_idx = torch.rand(P, T, sph, generator=gen).topk(W, -1).indices + base if sph <= 4096 else \
        torch.stack([torch.stack([torch.randperm(sph, generator=gen)[:W] for _ in range(T)])
                     for _ in range(P)]) + base
    q_idx = torch.randint(0, sph, (P, T, R), generator=gen) + base
    k_val = torch.randn(P, T, W, generator=gen).softmax(-1).to(dtype)
    q_val = (torch.randn(P, T, R, generator=gen) / R ** 0.5).to(dtype)
    v = torch.randn(P, T, hd, generator=gen).to(dtype)
    beta = torch.rand(P, T, generator=gen)
    g = -0.1 * torch.rand(P, T, 1, generator=gen)
    bank = (0.1 * torch.randn(P * sph, hd, generator=gen)).to(dtype)
    return [x.to(dev) for x in (bank, k_idx, k_val, v, beta, g, q_idx, q_val)]


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def timed(fn, dev, reps):
    if dev == "cuda":
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=reps, return_mode="median")
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="A")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated variant numbers (0 always runs)")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(P=2, T=80, hd=32, sph=96, W=4, R=4) if a.tiny else CONFIGS[a.config]
    C = 16 if a.tiny else a.chunk
    bank, *rest = (cuda_inputs(**cfg) if dev == "cuda" and not a.tiny else
                   make_inputs(**cfg, dev=dev, dtype=torch.bfloat16))
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(rest[2].shape, generator=gen).to(bank.dtype).to(dev)
    dM = torch.randn(bank.shape, generator=gen).to(bank.dtype).to(dev)
    keep = dict(host.CONFIG)
    chosen = list(range(len(VARIANTS))) if a.only is None else \
        sorted({0} | {int(i) for i in a.only.split(",")})
    print(f"{dev} {torch.cuda.get_device_name() if dev == 'cuda' else ''} torch {torch.__version__}"
          f" config {a.config if not a.tiny else 'tiny'} {cfg} C={C}", flush=True)
    print("| variant | no-grad fwd ms | fwd+bwd ms | rel err vs variant 0: readings / bank / "
          "grads (max) |\n| --- | --- | --- | --- |", flush=True)
    ref = None
    for i in chosen:
        name, over = VARIANTS[i]
        over = dict(over)
        # Phase 1 by binary searches and int64 keys (session 4) or scans (default)
        search = over.pop("PHASE1", "scan") == "search"
        phase1.SCAN_GROUPS = not search
        phase1._key_dtype = key_dtype_int64 if search else key_dtype
        host.CONFIG.clear()
        host.CONFIG.update(keep, **over)
        work = bank.clone()
        y = host.forward(work, *rest, C, "none", False)[0]
        outs = [y, work.clone()]
        w2 = bank.clone()
        _, rows, scales = host.forward(w2, *rest, C, "none", True)
        outs += list(host.backward(dy, dM, w2, rows, scales, *rest, C, "none", False))
        del rows, scales
        errs = "-" if ref is None else " / ".join(
            f"{rel(o, r):.1e}" for o, r in zip(outs[:2], ref[:2])) + \
            f" / {max(rel(o, r) for o, r in zip(outs[2:], ref[2:])):.1e}"
        if ref is None:
            ref = outs
        fwd = timed(lambda: host.forward(work, *rest, C, "none", False), dev, 150)

        def fwdbwd():
            _, rw, sc = host.forward(w2, *rest, C, "none", True)
            return host.backward(dy, dM, w2, rw, sc, *rest, C, "none", False)
        fb = timed(fwdbwd, dev, 300)
        print(f"| {i}: {name} | {fwd:.2f} | {fb:.2f} | {errs} |", flush=True)
    host.CONFIG.clear()
    host.CONFIG.update(keep)


if __name__ == "__main__":
    main()
