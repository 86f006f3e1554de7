"""Several GPUs: step time and memory per GPU of SDM training at a fixed per-GPU batch.

Run one size per launch, under torchrun (NCCL on GPUs, gloo on CPU):

    for n in 1 2 4 8; do
        torchrun --nproc-per-node $n benchmarks/bench_distributed.py --json bench_dist_$n.json
    done
    python benchmarks/bench_distributed.py --table bench_dist_*.json

Two workloads (``--mode``, both by default):

- ``fsdp`` (default): a stack of ``sdm_inductor.nn.SparseDeltaMemory`` layers with learned
  banks, ``fully_shard`` (FSDP2) per layer and on the root, AdamW, optionally
  ``--compile`` (per-layer ``torch.compile``). Each rank trains on its own
  ``--batch-per-gpu`` sequences: weak scaling, so an ideal step time is flat in N and the
  memory per GPU falls with the sharded parameters and optimizer state.
- ``streams``: the op alone on DTensors, bank and inputs ``Shard(0)`` by streams
  (``sdm_inductor.distributed``), forward + backward, ``--streams-per-gpu`` streams per
  rank: no communication inside the op, so the step time should not move with N.

Reported per rank: median step time (ms) over ``--steps`` after ``--warmup``, and peak
memory (CUDA: ``max_memory_allocated`` / ``max_memory_reserved``; CPU: the process's
peak RSS). Rank 0 prints the table and writes ``--json``. ``--tiny`` is a seconds-long
configuration for CPU checks (``tests/test_distributed.py`` runs it with 2 processes).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import sdm_inductor
import sdm_inductor.distributed  # noqa: F401  (DTensor rules for the streams workload)
from sdm_inductor.nn import SparseDeltaMemory

TINY = dict(batch_per_gpu=2, T=32, d_model=16, num_heads=2, head_dim=8, slots_per_head=16,
            top_k=4, layers=2, chunk_size=16, streams_per_gpu=4, steps=3, warmup=1,
            dtype="float32")


class Net(torch.nn.Module):
    """Input projection, ``layers`` pre-norm residual SDM layers, output projection."""

    def __init__(self, a):
        super().__init__()
        self.inp = torch.nn.Linear(a.d_model, a.d_model)
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(a.d_model) for _ in range(a.layers))
        self.layers = torch.nn.ModuleList(
            SparseDeltaMemory(a.d_model, num_heads=a.num_heads, head_dim=a.head_dim,
                              slots_per_head=a.slots_per_head, top_k=a.top_k,
                              chunk_size=a.chunk_size) for _ in range(a.layers))
        self.out = torch.nn.Linear(a.d_model, a.d_model)

    def forward(self, x):
        h = self.inp(x)
        for norm, layer in zip(self.norms, self.layers):
            h = h + layer(norm(h))
        return self.out(h)


def _device(kind: str = "auto"):
    """One GPU per rank (NCCL) when there are GPUs, unless ``--device cpu`` (gloo)."""
    if kind == "cuda" or (kind == "auto" and torch.cuda.is_available()):
        local, n = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local >= n:
            sys.exit(f"bench_distributed: local rank {local} needs GPU {local}, this machine "
                     f"has {n}; use --nproc-per-node <= {n} or --device cpu")
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fsdp_step(a, device, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    net = Net(a).to(device)
    # fp32 master weights; compute in the requested dtype, gradients reduced in fp32
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in net.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(net, mesh=mesh, mp_policy=mp)
    if a.compile:
        for layer in net.layers:
            layer.compile()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    x = torch.randn(a.batch_per_gpu, a.T, a.d_model, device=device, generator=gen)
    y = torch.randn(a.batch_per_gpu, a.T, a.d_model, device=device, generator=gen)

    def step():
        loss = F.mse_loss(net(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def _streams_step(a, device, mesh):
    from sdm_inductor.testing import make_inputs
    from torch.distributed.tensor import Shard, distribute_tensor

    n = dist.get_world_size()
    P = a.streams_per_gpu * n
    ins = make_inputs(P, a.T, W=a.top_k, R=a.top_k, hd=a.head_dim,
                      slots_per_stream=a.slots_per_head, dtype=getattr(torch, a.dtype),
                      device=device, seed=0)
    args = [distribute_tensor(t, mesh, [Shard(0)]) for t in ins]
    leaves = [t.requires_grad_(t.is_floating_point()) for t in args]

    def step():
        y, M = sdm_inductor.write_read(*leaves, chunk_size=a.chunk_size,
                                       slots_per_stream=a.slots_per_head)
        loss = y.float().square().mean() + M.float().square().mean()
        loss.backward()
        for t in leaves:
            t.grad = None
        return loss

    return step


def _peak_memory(device) -> dict:
    if device.type == "cuda":
        return {"peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}
    # ru_maxrss is KiB on Linux
    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def _measure(a, mode, device, mesh) -> dict:
    """One workload on this rank: warm-up, then ``a.steps`` timed steps."""
    step = (_fsdp_step if mode == "fsdp" else _streams_step)(a, device, mesh)
    t0 = time.perf_counter()
    for _ in range(a.warmup):  # the first step holds any compile
        step()
    _sync(device)
    warmup_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(a.steps):
        dist.barrier()
        _sync(device)
        t = time.perf_counter()
        loss = step()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    loss = loss.detach()
    loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss  # streams: a DTensor
    return {"rank": dist.get_rank(), "step_ms_median": statistics.median(times),
            "step_ms": times, "warmup_s": warmup_s, "loss": float(loss), **_peak_memory(device)}


def run(a):
    from torch.distributed.tensor import init_device_mesh

    device, backend = _device(a.device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (n,))
    runs = []
    for mode in (("fsdp", "streams") if a.mode == "all" else (a.mode,)):
        mine = _measure(a, mode, device, mesh)
        if device.type == "cuda":  # the next workload starts from an empty cache
            torch.cuda.empty_cache()
        ranks = [None] * n
        dist.all_gather_object(ranks, mine)
        runs.append({"mode": mode, "ranks": ranks})
    if rank == 0:
        result = {"world_size": n, "device": torch.cuda.get_device_name(device)
                  if device.type == "cuda" else "cpu", "backend": backend,
                  "torch": torch.__version__, "config": vars(a), "runs": runs}
        _print([result])
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
    # every rank done before any tears down: a rank that destroys its gloo group while rank
    # 0 still prints made rank 0 abort at exit ("terminate called without an active
    # exception", seen once in the CPU suite under load)
    dist.barrier()
    dist.destroy_process_group()
    # leave without the interpreter's teardown: on CPU (gloo) it still aborted a rank after
    # all of the above once in a few runs of the suite ("terminate called without an active
    # exception", exit code -6); everything is printed and written by now
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _print(results):
    """One table per workload, one row per world size."""
    c, first = results[0]["config"], results[0]
    for mode in dict.fromkeys(run["mode"] for r in results for run in r["runs"]):
        rows = sorted(((r["world_size"], run["ranks"]) for r in results for run in r["runs"]
                       if run["mode"] == mode), key=lambda x: x[0])
        mem_key = next(k for k in rows[0][1][0] if k.startswith("peak_"))
        size = (f"batch/GPU={c['batch_per_gpu']} d={c['d_model']} H={c['num_heads']} "
                f"layers={c['layers']} compile={c['compile']}" if mode == "fsdp"
                else f"streams/GPU={c['streams_per_gpu']}")
        print(f"\n{mode}: {size} T={c['T']} hd={c['head_dim']} "
              f"slots/head={c['slots_per_head']} top_k={c['top_k']} dtype={c['dtype']} "
              f"device={first['device']} torch={first['torch']}")
        print(f"{'GPUs':>5} {'step time ms (max over ranks)':>30} {'spread ms':>10} "
              f"{mem_key + ' (max)':>24}")
        for n, ranks in rows:
            t = [x["step_ms_median"] for x in ranks]
            m = max(x[mem_key] for x in ranks)
            print(f"{n:>5} {max(t):>30.2f} {max(t) - min(t):>10.2f} {m:>24.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("all", "fsdp", "streams"), default="all")
    ap.add_argument("--batch-per-gpu", type=int, default=4)
    ap.add_argument("--streams-per-gpu", type=int, default=16)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--num-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--slots-per-head", type=int, default=4096)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="seconds-long CPU check configuration")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: one GPU per rank when there are GPUs, else CPU processes")
    ap.add_argument("--json", help="write rank 0's result here")
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="print one table from the JSON files of several runs (no torchrun)")
    a = ap.parse_args(argv)
    if a.table:
        _print([json.load(open(p)) for p in a.table])
        return
    if "RANK" not in os.environ:
        sys.exit("run under torchrun: torchrun --nproc-per-node N benchmarks/bench_distributed.py")
    if a.tiny:
        for k, v in TINY.items():
            setattr(a, k, v)
    run(a)


if __name__ == "__main__":
    main()
