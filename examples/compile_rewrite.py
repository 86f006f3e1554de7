"""``torch.compile`` turns the naive token loop of a model into the fused op.

    python examples/compile_rewrite.py            # 2 heads x 16 tokens
    python examples/compile_rewrite.py --small    # CI size

The model is ``SparseDeltaMemory(naive=True)``: its recurrence is the plain PyTorch
token loop of docs/spec.md section 1 (``M[idx]``, ``index_put``, mul + sum per token), the
code a user writes first. ``sdm_inductor.explain`` shows what the rewrite
recognises; ``torch.compile`` then replaces the unrolled loop by one call of
``torch.ops.sdm.write_read``. The compiled training step is checked against eager and
timed against it.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch._dynamo.utils import counters

import sdm_inductor
from sdm_inductor.nn import SparseDeltaMemory


def step(fn, layer, x):
    """One training step's work: forward of ``fn`` (the layer or its compiled form), loss,
    backward; returns (loss, the layer's parameter gradients)."""
    layer.zero_grad(set_to_none=True)
    loss = fn(x).square().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()}


def timed(fn, *args, repeat: int):
    fn(*args)  # warm-up (the compiled function compiles here)
    t0 = time.perf_counter()
    for _ in range(repeat):
        out = fn(*args)
    return out, (time.perf_counter() - t0) / repeat


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CI size")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if args.small:
        d, T, sdm = 32, 8, dict(num_heads=2, slots_per_head=16, top_k=4, key_dim=8, chunk_size=16)
    else:
        d, T, sdm = 64, 16, dict(num_heads=2, slots_per_head=64, top_k=4, key_dim=16, chunk_size=16)
    layer = SparseDeltaMemory(d, naive=True, output_gate=True, **sdm).to(dev)
    x = torch.randn(1, T, d, device=dev)
    print(f"SparseDeltaMemory(naive=True): {sdm['num_heads']} heads x {T} tokens = "
          f"{sdm['num_heads'] * T} unrolled token steps, device {dev}")

    t0 = time.perf_counter()
    report = sdm_inductor.explain(layer, x)
    print(f"\nexplain ({time.perf_counter() - t0:.1f}s):\n{report}\n")
    if not report.rewritten:
        raise SystemExit("the rewrite did not recognise the naive token loop")

    compiled = torch.compile(layer)
    hits = counters["inductor"]["fxgraph_cache_hit"]
    t0 = time.perf_counter()
    step(compiled, layer, x)
    t_compile = time.perf_counter() - t0
    print(f"torch.compile first step (trace + rewrite + Inductor, forward and backward): {t_compile:.1f}s")
    if counters["inductor"]["fxgraph_cache_hit"] > hits:
        print("(Inductor's FX graph cache had this graph from an earlier run: the rewrite passes "
              "did not need to run again)")
    else:
        print(f"rewrites in that compile: {sdm_inductor.patterns.last_report()}")

    repeat = 2 if args.small else 5
    (loss_e, grads_e), t_eager = timed(step, layer, layer, x, repeat=repeat)
    (loss_c, grads_c), t_comp = timed(step, compiled, layer, x, repeat=repeat)
    layer.naive = False
    (loss_o, _), t_op = timed(step, layer, layer, x, repeat=repeat)
    layer.naive = True

    worst_grad = max(rel(grads_c[n], grads_e[n]) for n in grads_e)
    print(f"loss eager {loss_e.item():.6f}, compiled {loss_c.item():.6f}; "
          f"worst parameter-gradient rel err {worst_grad:.2e}")
    print(f"training step: eager token loop {1e3 * t_eager:.1f} ms, compiled (rewritten) "
          f"{1e3 * t_comp:.1f} ms ({t_eager / t_comp:.1f}x); eager explicit op {1e3 * t_op:.1f} ms")
    if rel(loss_c, loss_e) > 1e-5 or worst_grad > 1e-4:
        raise SystemExit("MISMATCH between the compiled and the eager step")
    print("OK: the compiled, rewritten step equals the eager token loop")


if __name__ == "__main__":
    main()
