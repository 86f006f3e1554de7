"""CUDA benchmark of the Triton kernels. One run on an H200 prints:

- device-to-device copy bandwidth (the ceiling used for the floors);
- configs A and B of docs/spec.md section 5 for C in {64, 128, 256}: no-grad forward,
  training forward (saving the snapshot), forward + backward (the triton ops called
  one after the other, and through ``sdm::write_read`` and autograd, where the forward
  hands its Phase 1 and ``v - r0`` to the backward), peak memory of forward + backward; the bandwidth floor of each from the distinct written rows of
  the actual inputs, and the fraction of it reached;
- the eager no-grad op's working memory at several T (must not grow with T);
- decode latency per step (P=16, T=1, hd=768, W=R=64) under a CUDA graph;
- beside each config's eager figures, its no-grad and forward + backward calls replayed
  from CUDA graphs (the GPU's own time, free of the host's).

Usage: python benchmarks/bench_cuda.py [--json PATH] [--quick]
"""
from __future__ import annotations

import argparse
import json
import time
import math

import torch
import triton.testing

import sdm_inductor  # noqa: F401  (ops, CUDA implementation)
from sdm_inductor import ops
from sdm_inductor.kernels import host

GIB = 2 ** 30
CONFIGS = {
    "A": dict(P=2, T=8192, hd=768, sph=36864, W=64, R=64),
    "B": dict(P=1, T=8192, hd=1536, sph=147456, W=64, R=64),
}
BASELINE_1X = {"A": dict(fwd=16.2, fwdbwd=43.7, peak=3.01), "B": dict(fwd=6.3, fwdbwd=19.5, peak=4.46)}
TARGET = {"A": dict(fwd=2.5, fwdbwd=8.0), "B": dict(fwd=1.5, fwdbwd=5.0)}


def set_knob(kv: str):
    """``KEY=INT`` sets ``kernels.host.CONFIG[KEY]``; ``module.NAME=INT`` the constant
    ``NAME`` of ``sdm_inductor.kernels.module`` (e.g. ``phase1.pairs.PAIR_WARPS=1``)."""
    import importlib
    key, value = kv.split("=")
    if "." in key:
        mod, name = key.rsplit(".", 1)
        module = importlib.import_module(f"sdm_inductor.kernels.{mod}")
        if not hasattr(module, name):   # a misspelt or removed knob would change nothing
            raise SystemExit(f"no constant {name} in sdm_inductor.kernels.{mod}")
        setattr(module, name, int(value))
    else:
        if key not in host.CONFIG:
            raise SystemExit(f"no key {key} in kernels.host.CONFIG")
        host.CONFIG[key] = int(value)


def bench(fn, rep=300):
    return triton.testing.do_bench(fn, warmup=50, rep=rep, return_mode="median")


def bench_graph(fn, rep=300):
    """``bench`` of ``fn`` replayed from a CUDA graph: the GPU's own time, no host cost
    (captured after a warm-up on a side stream, as torch.cuda.graphs asks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ms = bench(g.replay, rep=rep)
    del g
    return ms


def copy_bandwidth() -> float:
    x = torch.empty(GIB // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def make_inputs(P, T, hd, sph, W, R, dtype=torch.bfloat16, seed=0):
    """Random inputs of a config: W distinct write slots per token, random reads."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    base = (torch.arange(P, device=dev) * sph).view(P, 1, 1)
    k_idx = torch.empty(P, T, W, dtype=torch.int64, device=dev)
    for p in range(P):
        for t0 in range(0, T, 256):
            n = min(256, T - t0)
            k_idx[p, t0:t0 + n] = torch.rand(n, sph, device=dev, generator=gen).topk(W, -1).indices
    k_idx += base
    q_idx = torch.randint(0, sph, (P, T, R), device=dev, generator=gen) + base
    k_val = torch.randn(P, T, W, device=dev, generator=gen).softmax(-1).to(dtype)
    q_val = (torch.randn(P, T, R, device=dev, generator=gen) / math.sqrt(R)).to(dtype)
    v = torch.randn(P, T, hd, device=dev, generator=gen).to(dtype)
    beta = torch.rand(P, T, device=dev, generator=gen)
    g = -0.1 * torch.rand(P, T, 1, device=dev, generator=gen)
    bank = (0.1 * torch.randn(P * sph, hd, device=dev, generator=gen)).to(dtype)
    return bank, k_idx, k_val, v, beta, g, q_idx, q_val


def floors(ins, C, bw):
    """Bandwidth floors (ms) of the no-grad forward, the training forward and fwd+bwd."""
    bank, k_idx, _, _, _, _, q_idx, _ = ins
    P, T, W = k_idx.shape
    R = q_idx.shape[2]
    S, hd = bank.shape
    es = bank.element_size()
    chunk = (torch.arange(T, device="cuda") // C).view(1, T, 1)
    seg = torch.arange(P, device="cuda").view(P, 1, 1) * math.ceil(T / C) + chunk
    written = torch.unique((seg * S + k_idx).reshape(-1)).numel()
    touched = torch.unique(torch.cat([(seg * S + k_idx).reshape(-1),
                                      (seg * S + q_idx).reshape(-1)])).numel()
    fwd = (2 * written + P * T * R) * hd * es
    saved = written * hd * es   # the undo log: one row per distinct written row and chunk
    # the backward reads the log and restores those rows, gathers every touched row and
    # rewrites dB's
    bwd = 2 * saved + 2 * touched * hd * es
    to_ms = lambda b: b / bw * 1e3
    return dict(fwd=to_ms(fwd), train=to_ms(fwd + saved), fwdbwd=to_ms(fwd + saved + bwd),
                distinct_written_rows=written)


def run_config(name, C, bw, quick=False, mode="none"):
    cfg = CONFIGS[name]
    ins = make_inputs(**cfg)
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = ins
    rest = (k_idx, k_val, v, beta, g, q_idx, q_val)
    work = bank.clone()
    fwd = bench(lambda: torch.ops.sdm.triton_write_read_(work, *rest, C))
    train = bench(lambda: torch.ops.sdm.triton_write_read(bank, *rest, C, mode, True))
    dy = torch.randn_like(v)
    dM = torch.randn_like(bank)

    def fwdbwd():
        # nothing handed over: the backward recomputes Phase 1 and v - r0
        y, M, rows, scales, _ = torch.ops.sdm.triton_write_read(bank, *rest, C, mode, True)
        return torch.ops.sdm.triton_write_read_backward(dy, dM, M, rows, scales, *rest, C, mode,
                                                        False, [])

    fb = bench(fwdbwd, rep=200 if quick else 400)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwdbwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    autograd = autograd_step(ins, dy, dM, C, mode)
    fb_ag = bench(autograd, rep=200 if quick else 400)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    autograd()
    torch.cuda.synchronize()
    # the step's leaves are copies of the inputs, which a training step would not hold twice
    peak_ag = torch.cuda.max_memory_allocated() - autograd.leaf_bytes
    # the same calls replayed from CUDA graphs: the GPU's own time. An eager call's host
    # time comes near its GPU time here, and a slow host makes whole rows slow; the eager
    # figures stay the benchmark's
    try:
        fwd_graph = bench_graph(lambda: torch.ops.sdm.triton_write_read_(work, *rest, C))
        fb_graph = bench_graph(fwdbwd, rep=200)
    except RuntimeError as e:   # a capture that fails is reported, not fatal to the table
        print(f"{name} C={C} {mode}: CUDA graph capture failed: {e}")
        fwd_graph = fb_graph = float("nan")
    torch.cuda.empty_cache()
    fl = floors(ins, C, bw)
    return dict(config=name + ("" if mode == "none" else f" {mode}"), C=C, fwd_ms=fwd, train_fwd_ms=train, fwdbwd_ms=fb,
                fwd_graph_ms=fwd_graph, fwdbwd_graph_ms=fb_graph,
                fwdbwd_autograd_ms=fb_ag, peak_autograd_gib=peak_ag / GIB,
                peak_gib=peak / GIB, peak_over_inputs_gib=(peak - base) / GIB,
                floor_fwd_ms=fl["fwd"], floor_train_ms=fl["train"], floor_fwdbwd_ms=fl["fwdbwd"],
                distinct_written_rows=fl["distinct_written_rows"])


def autograd_step(ins, dy, dM, C, mode):
    """Forward + backward as training runs it: ``sdm::write_read`` on leaves, then
    ``torch.autograd.backward`` (the forward hands its Phase 1 and ``v - r0`` to the
    backward, ``Kept``). Index checks off (a host sync each; the op-level rows have
    none either); the gradients are dropped after each call (no accumulation)."""
    ops.CHECK_INDICES["cuda"] = False
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = ins
    leaves = [x.detach().clone().requires_grad_() for x in (bank, k_val, v, beta, g, q_val)]
    sph = bank.shape[0] // k_idx.shape[0]

    def step():
        lb, lk, lv, lbeta, lg, lq = leaves
        y, M, _, _ = torch.ops.sdm.write_read(lb, k_idx, lk, lv, lbeta, lg, q_idx, lq, C, sph,
                                              False, mode)
        torch.autograd.backward((y, M), (dy, dM))
        grads = [x.grad for x in leaves]
        for x in leaves:
            x.grad = None
        return [y, M] + grads   # for checks; the timed calls drop them
    step.leaf_bytes = sum(x.numel() * x.element_size() for x in leaves)
    return step


def nograd_memory(Ts=(2048, 4096, 8192)):
    """Working memory (peak over inputs and readings) of the eager no-grad path at config A:
    the CUDA implementation itself (``host.forward``, windowed) and the whole eager op
    (which adds the lead's host-side checks and repeat count)."""
    out = {}
    ops.CHECK_INDICES["cuda"] = False
    for T in Ts:
        ins = make_inputs(**dict(CONFIGS["A"], T=T))
        for name, fn in (("impl", lambda: host.forward(ins[0], *ins[1:], 64, "none", False)[0]),
                         ("op", lambda: torch.ops.sdm.write_read_(*ins, 64, CONFIGS["A"]["sph"],
                                                                  False))):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            y = fn()
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - base - y.numel() * y.element_size()
            out[f"{name} T={T}"] = extra / GIB
            del y
        del ins
    ops.CHECK_INDICES["cuda"] = True
    return out


def decode_latency(P=16, hd=768, W=64, R=64, sph=4096, steps=2000):
    ins = make_inputs(P, 1, hd, sph, W, R)
    bank, rest = ins[0], ins[1:]
    for _ in range(3):
        torch.ops.sdm.triton_write_read_(bank, *rest, 64)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.sdm.triton_write_read_(bank, *rest, 64)
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--chunks", default="64,128,256")
    ap.add_argument("--walks", default=host.CONFIG["WALK"],
                    help="walks to compare, e.g. step,queue,column (forward/ and backward/ "
                         "step_walk.py, queue_walk.py; forward/column_walk.py, "
                         "backward/reverse_walk.py); the autograd column hands Phase 1 and "
                         "v - r0 to the backward as a compiled graph's emitted kernels do")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=INT",
                    help="override kernels.host.CONFIG entries, e.g. NG_STEP=64 WARPS_STEP_W=8")
    ap.add_argument("--no-extras", action="store_true",
                    help="skip the fp8 / BD_BWD rows, the no-grad memory and the decode step")
    ap.add_argument("--warmup", type=float, default=5.0, metavar="S",
                    help="seconds of unrecorded rows of the first config before measuring")
    args = ap.parse_args()
    for kv in args.set:
        set_knob(kv)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "config", host.CONFIG)
    bw = copy_bandwidth()
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s")
    rows = []
    walks = args.walks.split(",")
    if args.warmup > 0:
        # the first row measured in a process can read 15-35 % slow (A C=64 no-grad
        # 4.26 / 4.87 ms against 3.64 for the same call later in the same process), and
        # outliers come as single rows: the first config's rows run once, unrecorded,
        # before any row is kept (cause not found: clocks, first-touch costs)
        first = args.configs.split(",")[0]
        t_end = time.perf_counter() + args.warmup
        while time.perf_counter() < t_end:
            run_config(first, int(args.chunks.split(",")[0]), bw, True)
    for name in args.configs.split(","):
        for C in (int(c) for c in args.chunks.split(",")):
            for walk in walks:
                host.CONFIG["WALK"] = walk
                r = run_config(name, C, bw, args.quick)
                r["phase1_ms"] = phase1_ms(name, C)
                if len(walks) > 1:
                    r["config"] += " " + walk
                rows.append(r)
                print(json.dumps(r), flush=True)
    host.CONFIG["WALK"] = walks[0]
    if args.no_extras:
        return table(rows, args, bw, None, float("nan"))
    if "A" in args.configs:
        # the snapshot's share of the peak; and fewer, wider backward column blocks
        # (fewer partial sums, less parallelism)
        r = run_config("A", 64, bw, args.quick, mode="fp8")
        rows.append(r)
        print(json.dumps(r), flush=True)
        old = host.CONFIG["BD_BWD"]
        host.CONFIG["BD_BWD"] = 32
        r = run_config("A", 64, bw, args.quick)
        r["config"] = "A BD_BWD=32"
        host.CONFIG["BD_BWD"] = old
        rows.append(r)
        print(json.dumps(r), flush=True)
    mem = nograd_memory()
    dec = decode_latency()
    table(rows, args, bw, mem, dec)


def eager_plan(S, k_idx, k_val, beta, g, q_idx, q_val, C):
    """``phase1.plan`` launched as the eager op launches it (``wrap_triton`` off: through
    the higher-order op each launch costs ~100 us of host time, and a timing of it would
    be the host's)."""
    from sdm_inductor.kernels.runtime.launch import set_wrap_triton_enabled
    from sdm_inductor.kernels.phase1 import plan
    with set_wrap_triton_enabled(False):
        return plan(S, k_idx, k_val, beta, g, q_idx, q_val, C)


def phase1_ms(name, C):
    """Phase 1 alone (``eager_plan``) at a config: the part of the forward before the walk."""
    bank, k_idx, k_val, v, beta, g, q_idx, q_val = make_inputs(**CONFIGS[name])
    return bench(lambda: eager_plan(bank.shape[0], k_idx, k_val, beta, g, q_idx, q_val, C),
                 rep=100)


def table(rows, args, bw, mem, dec):
    print()
    print("| config | C | no-grad fwd ms | train fwd ms | fwd+bwd ms ops / autograd | peak GiB "
          "ops / autograd | floor fwd / train / fwd+bwd ms | fraction of floor fwd / fwd+bwd "
          "| CUDA graph no-grad / fwd+bwd ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['config']} | {r['C']} | {r['fwd_ms']:.2f} | {r['train_fwd_ms']:.2f} | "
              f"{r['fwdbwd_ms']:.2f} / {r['fwdbwd_autograd_ms']:.2f} | {r['peak_gib']:.2f} / "
              f"{r['peak_autograd_gib']:.2f} | {r['floor_fwd_ms']:.2f} / "
              f"{r['floor_train_ms']:.2f} / {r['floor_fwdbwd_ms']:.2f} | "
              f"{r['floor_fwd_ms'] / r['fwd_ms']:.2f} / {r['floor_fwdbwd_ms'] / r['fwdbwd_ms']:.2f} | "
              f"{r['fwd_graph_ms']:.2f} / {r['fwdbwd_graph_ms']:.2f} |"
              + (f" phase 1 {r['phase1_ms']:.2f} ms" if "phase1_ms" in r else ""))
    for name in sorted({r["config"] for r in rows if r["config"].split()[0] in CONFIGS
                        and "BD_BWD" not in r["config"] and "fp8" not in r["config"]}):
        rs = [r for r in rows if r["config"] == name]
        best = min(rs, key=lambda r: r["fwd_ms"])
        c64 = [r for r in rs if r["C"] == 64]
        ratio = c64[0]["fwd_ms"] / best["fwd_ms"] if c64 else float("nan")
        bfb = min(min(r["fwdbwd_ms"], r["fwdbwd_autograd_ms"]) for r in rs)
        key = name.split()[0]
        print(f"config {name}: best no-grad fwd {best['fwd_ms']:.2f} ms (C={best['C']}; 1.x "
              f"{BASELINE_1X[key]['fwd']}, goal <= {TARGET[key]['fwd']}), best fwd+bwd "
              f"{bfb:.2f} ms (1.x {BASELINE_1X[key]['fwdbwd']}, goal <= {TARGET[key]['fwdbwd']}), "
              f"C=64 / best C no-grad fwd = {ratio:.2f} (goal <= 1.3)")
    if mem is not None:
        print("no-grad working memory (GiB over inputs + readings, config A, C=64):",
              {k: round(v, 3) for k, v in mem.items()})
        print(f"decode step (P=16, T=1, hd=768, W=R=64, CUDA graph): {dec:.1f} us (goal <= 15)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(copy_bw=bw, rows=rows, nograd_mem=mem, decode_us=dec,
                           config=host.CONFIG), f, indent=1)


if __name__ == "__main__":
    main()
