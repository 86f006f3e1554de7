"""torch.compile vs eager for the sdm op and for a model of SDM layers.

    python benchmarks/bench_compile.py [--configs A,B] [--cases op,gated,gatedop]
        [--dynamic static,dynamic] [--no-model] [--reps 10] [--json out.json]
    python benchmarks/bench_compile.py --small          # tiny sizes: a smoke run on CPU

Part 1, configs A and B of docs/spec.md section 5 (bf16), eager vs compiled:
  - ``op``: the explicit op alone (inputs already prepared), no-grad forward and
    forward + backward. Compiled should match eager (the same kernels): within 3%.
  - ``gated``: the op with the elementwise math around it (softmax weights, sigmoid
    write strength, ``-exp(A_log) * softplus(a + dt_bias)`` decay, silu output gate).
    Eager runs each of those as its own kernels; compiled fuses them.
  - ``gatedop``: the same computation with the gate prologue inside the op
    (``sdm::write_read_gated``: on CUDA the prep kernel computes sigmoid and the
    softplus decay from the raw inputs; the layer's path). Compare its compiled time
    with ``gated``'s: the difference is what moving the gates into the op buys.
Part 2, a model of 4 residual SDM layers (``sdm_inductor.nn.SparseDeltaMemory`` with
output gate, RMSNorm, projections): training step (forward + backward) eager vs
compiled, and the compile time of the first step.

Times are medians over ``--reps`` calls after warm-up (CUDA: events, synchronised).
Compile times are measured with Inductor's caches off.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import sdm_inductor
from sdm_inductor.lowerings import write_read as lowering
from sdm_inductor.nn import SparseDeltaMemory

DUMP = os.environ.get("SDM_DUMP_CODE")   # a folder: the output code of each compile

CONFIGS = {
    # P, T, hd, slots per stream, W = R, chunk
    "A": dict(P=2, T=8192, hd=768, sph=36864, W=64, C=128),
    "B": dict(P=1, T=8192, hd=1536, sph=147456, W=64, C=128),
    "small": dict(P=2, T=96, hd=16, sph=256, W=8, C=32),
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, reps: int, warmup: int = 2) -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def first_call(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


# ---------------------------------------------------------------- part 1: the op

def op_inputs(P, T, hd, sph, W, C, device, dtype=torch.bfloat16):
    """Raw (pre-activation) inputs; W distinct write slots per token: one per stratum."""
    gen = torch.Generator(device=device).manual_seed(0)
    r = lambda *s, dt=dtype: torch.randn(*s, generator=gen, device=device, dtype=dt)
    stride = sph // W
    base = (torch.arange(P, device=device) * sph).view(P, 1, 1)
    k_idx = (torch.randint(0, stride, (P, T, W), generator=gen, device=device)
             + torch.arange(W, device=device) * stride + base).int()
    q_idx = (torch.randint(0, sph, (P, T, W), generator=gen, device=device) + base).int()
    return dict(bank=r(P * sph, hd) * 0.1, k_idx=k_idx, k_logit=r(P, T, W), v=r(P, T, hd),
                b_logit=r(P, T, dt=torch.float32), a=r(P, T, 1, dt=torch.float32),
                q_idx=q_idx, q_logit=r(P, T, W), A_log=torch.zeros((), device=device),
                dt_bias=torch.full((), -2.0, device=device), z=r(P, T, hd), C=C, sph=sph)


def prepared(x):
    """The op's own inputs, computed once (for the explicit-op case)."""
    with torch.no_grad():
        return dict(bank=x["bank"], k_idx=x["k_idx"], k_val=torch.softmax(x["k_logit"], -1),
                    v=x["v"], beta=torch.sigmoid(x["b_logit"]),
                    g=-torch.exp(x["A_log"]) * F.softplus(x["a"] + x["dt_bias"]),
                    q_idx=x["q_idx"], q_val=torch.softmax(x["q_logit"], -1))


def explicit_op(bank, k_idx, k_val, v, beta, g, q_idx, q_val, *, C, sph):
    return sdm_inductor.write_read(bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size=C,
                                   slots_per_stream=sph)


def gated_op(bank, k_idx, k_logit, v, b_logit, a, q_idx, q_logit, A_log, dt_bias, z, *, C, sph):
    g = -torch.exp(A_log) * F.softplus(a + dt_bias)
    y, M = sdm_inductor.write_read(
        bank, k_idx, torch.softmax(k_logit, -1), v, torch.sigmoid(b_logit), g, q_idx,
        torch.softmax(q_logit, -1), chunk_size=C, slots_per_stream=sph)
    return y * F.silu(z), M


def gated_in_op(bank, k_idx, k_logit, v, b_logit, a, q_idx, q_logit, A_log, dt_bias, z, *, C,
                sph):
    """``gated_op`` with beta and g computed inside ``sdm::write_read_gated``."""
    P = k_idx.shape[0]
    y, M = sdm_inductor.api.write_read_gated(
        bank, k_idx, torch.softmax(k_logit, -1), v, b_logit, a[..., 0], A_log.expand(P),
        dt_bias.expand(P), q_idx, torch.softmax(q_logit, -1), chunk_size=C, slots_per_stream=sph)
    return y * F.silu(z), M


def bench_case(name, fn, kwargs, grad_keys, device, reps, dynamic=None):
    """Eager vs compiled, no-grad forward and forward + backward, for one function.
    ``dynamic``: torch.compile's (None: a static length first, as a model's first call;
    True: a symbolic length, one compilation for every length)."""
    opts = {k: kwargs.pop(k) for k in ("C", "sph")}
    f = lambda **kw: fn(**kw, **opts)
    compiled_fn = torch.compile(f, fullgraph=True, dynamic=dynamic)
    rows = []
    for mode in ("forward", "forward+backward"):
        train = mode != "forward"
        leaves = {k: (v.detach().requires_grad_(train and k in grad_keys)
                      if torch.is_tensor(v) else v) for k, v in kwargs.items()}

        def run(g):
            if train:
                y, M = g(**leaves)
                torch.autograd.backward((y, M), (torch.ones_like(y), torch.ones_like(M)))
                for v in leaves.values():
                    if torch.is_tensor(v):
                        v.grad = None
            else:
                with torch.no_grad():
                    g(**leaves)

        codes = []
        with torch._inductor.config.patch(force_disable_caches=True):
            # with DUMP, the first call also keeps its output code
            compile_s = first_call(
                lambda: codes.extend(run_and_get_code(lambda: run(compiled_fn))[1]) if DUMP
                else run(compiled_fn), device)
        if DUMP:
            for i, code in enumerate(codes):
                tag = f"{name}_{'dyn' if dynamic else 'static'}_{mode.replace('+', '_')}_{i}"
                with open(os.path.join(DUMP, tag + ".py"), "w") as fh:
                    fh.write(code)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        eager = timed(lambda: run(f), device, reps)
        peak_eager = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        comp = timed(lambda: run(compiled_fn), device, reps)
        peak_comp = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
        rows.append(dict(case=name, mode=mode, dynamic=bool(dynamic), emit=lowering.EMIT_KERNELS, eager_ms=eager * 1e3, compiled_ms=comp * 1e3,
                         speedup=eager / comp, compile_s=compile_s,
                         peak_eager_gib=peak_eager / 2**30, peak_compiled_gib=peak_comp / 2**30))
        print(f"  {name:<6}{' dyn' if dynamic else '    '} {mode:<17} eager {eager * 1e3:9.3f} ms   compiled {comp * 1e3:9.3f} ms"
              f"   x{eager / comp:5.3f}   (compile {compile_s:5.1f} s, peak "
              f"{peak_eager / 2**30:.2f} / {peak_comp / 2**30:.2f} GiB)", flush=True)
    torch._dynamo.reset()
    return rows


def bench_config(cfg_name, device, reps, cases, dynamic):
    cfg = CONFIGS[cfg_name]
    print(f"config {cfg_name}: {cfg}", flush=True)
    x = op_inputs(**cfg, device=device)
    rows = []
    gated_grads = ("bank", "k_logit", "v", "b_logit", "a", "q_logit", "z")
    for dyn in dynamic:
        if "op" in cases:
            explicit = dict(prepared(x), C=cfg["C"], sph=cfg["sph"])
            rows += bench_case("op", explicit_op, explicit,
                               ("bank", "k_val", "v", "beta", "g", "q_val"), device, reps, dyn)
        if "gated" in cases:
            rows += bench_case("gated", gated_op, dict(x), gated_grads, device, reps, dyn)
        if "gatedop" in cases:
            rows += bench_case("gatedop", gated_in_op, dict(x), gated_grads, device, reps, dyn)
    for r in rows:
        r["config"] = cfg_name
    return rows


# ---------------------------------------------------------------- part 2: a model

class Block(torch.nn.Module):
    def __init__(self, d, **sdm):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d)
        self.sdm = SparseDeltaMemory(d, **sdm)

    def forward(self, x):
        return x + self.sdm(self.norm(x))


def bench_model(device, reps, small):
    if small:
        d, B, T, sdm = 32, 2, 64, dict(num_heads=2, slots_per_head=64, top_k=4, key_dim=8)
    else:
        d, B, T, sdm = 1024, 2, 2048, dict(num_heads=8, slots_per_head=16384, top_k=32,
                                           key_dim=32)
    sdm.update(output_gate=True, chunk_size=64)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(d, **sdm) for _ in range(4)]).to(device, dtype)
    x = torch.randn(B, T, d, device=device, dtype=dtype)
    print(f"model: 4 x SDM layer d={d} B={B} T={T} {sdm} {dtype}", flush=True)

    def step(m):
        m(x).float().square().mean().backward()
        for p in model.parameters():
            p.grad = None

    compiled = torch.compile(model, fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        compile_s = first_call(lambda: step(compiled), device)
    eager = timed(lambda: step(model), device, reps)
    comp = timed(lambda: step(compiled), device, reps)
    print(f"  train step  eager {eager * 1e3:9.3f} ms   compiled {comp * 1e3:9.3f} ms   "
          f"x{eager / comp:5.3f}   compile {compile_s:5.1f} s", flush=True)
    return [dict(case="model4", mode="forward+backward", eager_ms=eager * 1e3,
                 compiled_ms=comp * 1e3, speedup=eager / comp, compile_s=compile_s,
                 d_model=d, B=B, T=T, **sdm)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cases", default="op,gated,gatedop")
    ap.add_argument("--dynamic", default="static",
                    help="comma list of static (a static length first) and dynamic")
    ap.add_argument("--emit", default=lowering.EMIT_KERNELS,
                    help="lowerings.write_read.EMIT_KERNELS: aot (torch.compile calls the eager "
                         "op) or always (its output code launches the SDM kernels: Phase 1 and "
                         "the single-launch walks)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lowering.EMIT_KERNELS = args.emit
    print(f"torch {torch.__version__} on "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, EMIT_KERNELS="
          f"{args.emit}")
    rows = []
    for name in (["small"] if args.small else args.configs.split(",")):
        if name:
            rows += bench_config(name, device, args.reps, args.cases.split(","),
                                 [{"static": None, "dynamic": True}[d]
                                  for d in args.dynamic.split(",")])
    if not args.no_model:
        rows += bench_model(device, args.reps, args.small)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, device=str(device), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
