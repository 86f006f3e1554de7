"""Train a small language model with a SparseDeltaMemory layer on associative recall.

Each sequence lists ``pairs`` key-value pairs (distinct keys), then asks for every key
again in a new order, each followed by its value. The model must predict the value
after each repeated key, which it can only do by writing the pairs into the memory
and reading them back. Loss is measured on those answers; chance is 1 / values.

    python examples/train_recall.py            # default size: a few minutes on 2 CPU cores
    python examples/train_recall.py --small    # CI size: under a minute

The model is small: on CPU, ``OMP_NUM_THREADS=1`` is usually the fastest setting (its
many tiny ops gain nothing from threads, and lose a lot on a loaded machine).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from sdm_inductor.nn import SparseDeltaMemory


class RecallTask:
    """Token ids: keys ``[0, K)``, values ``[K, K + V)``."""

    def __init__(self, n_keys: int, n_values: int, pairs: int):
        self.K, self.V, self.pairs = n_keys, n_values, pairs
        self.vocab = n_keys + n_values

    def batch(self, size: int, gen: torch.Generator, device):
        """(tokens [size, 4*pairs], answer mask [size, 4*pairs]): mask marks the positions
        whose *next* token is an answer to a query."""
        n = self.pairs
        keys = torch.rand(size, self.K, generator=gen).argsort(-1)[:, :n]
        vals = self.K + torch.randint(0, self.V, (size, n), generator=gen)
        order = torch.rand(size, n, generator=gen).argsort(-1)
        write = torch.stack([keys, vals], -1).view(size, 2 * n)
        query = torch.stack([keys.gather(1, order), vals.gather(1, order)], -1).view(size, 2 * n)
        tokens = torch.cat([write, query], 1)
        mask = torch.zeros_like(tokens, dtype=torch.bool)
        mask[:, 2 * n::2] = True  # a query key: the next token is its value
        return tokens.to(device), mask.to(device)


class RecallLM(nn.Module):
    """Embeddings of the current and the previous token -> SDM layer -> MLP -> logits.

    The previous-token embedding lets a value token write under its key's address and a
    query key read from that same address (the job a short convolution does in larger
    models)."""

    def __init__(self, vocab: int, d_model: int, **sdm_kwargs):
        super().__init__()
        self.cur = nn.Embedding(vocab, d_model)
        self.prev = nn.Embedding(vocab + 1, d_model)  # id ``vocab``: no previous token
        self.sdm = SparseDeltaMemory(d_model, **sdm_kwargs)
        self.norm = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, vocab)
        self.bos = vocab

    def forward(self, tokens):
        prev = F.pad(tokens, (1, 0), value=self.bos)[:, :-1]
        h = self.cur(tokens) + self.prev(prev)
        h = h + self.sdm(h)
        h = h + self.mlp(self.norm(h))
        return self.head(h)


def answer_loss(model, tokens, mask):
    logits = model(tokens)[:, :-1]
    target, m = tokens[:, 1:], mask[:, :-1]
    loss = F.cross_entropy(logits[m], target[m])
    acc = (logits[m].argmax(-1) == target[m]).float().mean()
    return loss, acc


class Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, width: int = 30):
        self.total, self.width, self.t0 = total, width, time.time()

    def update(self, step: int, **stats):
        done = int(self.width * step / self.total)
        text = " ".join(f"{k} {v:.3f}" for k, v in stats.items())
        sys.stderr.write(f"\r[{'#' * done}{'.' * (self.width - done)}] {step}/{self.total} "
                         f"{time.time() - self.t0:5.1f}s {text}")
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\n")


SIZES = {
    # keys, values, pairs, d_model, heads, slots/head, top_k, batch, steps, lr
    "default": dict(keys=64, values=32, pairs=16, d_model=64, heads=2, slots=256, top_k=8,
                    batch=32, steps=600, lr=3e-3),
    "small": dict(keys=16, values=16, pairs=6, d_model=64, heads=2, slots=64, top_k=4,
                  batch=32, steps=100, lr=6e-3),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CI size (under a minute on 2 CPU cores)")
    ap.add_argument("--steps", type=int, help="override the number of training steps")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cfg = dict(SIZES["small" if args.small else "default"])
    if args.steps:
        cfg["steps"] = args.steps
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    dev = torch.device(args.device)

    task = RecallTask(cfg["keys"], cfg["values"], cfg["pairs"])
    model = RecallLM(task.vocab, cfg["d_model"], num_heads=cfg["heads"],
                     slots_per_head=cfg["slots"], top_k=cfg["top_k"]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg["lr"], total_steps=cfg["steps"], pct_start=0.1)
    print(f"associative recall: {cfg['pairs']} pairs of {cfg['keys']} keys / {cfg['values']} values, "
          f"sequence {4 * cfg['pairs']} tokens, device {dev}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    print(f"chance accuracy {1 / cfg['values']:.3f}, chance loss {torch.log(torch.tensor(float(cfg['values']))):.3f}")

    bar, first, t0 = Progress(cfg["steps"]), None, time.time()
    for step in range(1, cfg["steps"] + 1):
        tokens, mask = task.batch(cfg["batch"], gen, dev)
        loss, acc = answer_loss(model, tokens, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        first = loss.item() if first is None else first
        if step % 10 == 0 or step == cfg["steps"]:
            bar.update(step, loss=loss.item(), acc=acc.item())
    bar.close()

    model.eval()
    with torch.no_grad():
        tokens, mask = task.batch(256, gen, dev)
        loss, acc = answer_loss(model, tokens, mask)
    print(f"train time {time.time() - t0:.1f}s")
    print(f"loss: first step {first:.3f} -> held-out {loss.item():.3f}")
    print(f"recall accuracy (held-out, 256 sequences): {acc.item():.3f} (chance {1 / cfg['values']:.3f})")
    return first, loss.item(), acc.item(), 1 / cfg["values"]


if __name__ == "__main__":
    main()
