"""The queue walks' item protocol under every order a GPU may run it in.

A queue walk's programs take items by ticket and wait on per-group counts
(``forward/queue_walk.py``, ``backward/queue_walk.py``). On a GPU many programs run at
once, so an item may run as soon as its waits are met, beside items of smaller and larger
tickets. The interpreter runs one program, which takes every ticket in order: the results
are right whatever the waits say, so the interpreter cases cannot show a missing wait.

Here the kernels' own code gives the protocol: an interpreter run (a subprocess with
``TRITON_INTERPRET=1``) records, item by item in ticket order, which item function ran
(kind, chunk, group), the buffers it was handed, the counts it waited for and the count
it raised. Then a scheduler replays those items over many programs in random orders that
the recorded waits allow, and checks every order against the one-program order:

- no deadlock (some program can always go on);
- an item starts only when every item of smaller ticket that conflicts with it (another
  item's write of a buffer region it reads or writes, or another item's read of a region
  it writes) has finished. Items of one (kind, chunk, group) touch disjoint parts of
  their regions (tokens, tiles), so they never conflict with each other.

A region is a buffer (its address as handed to the item) and a group (stream, column
block): the walks are separable by group. Which of an item's buffers it reads and writes
is declared below, from the item functions' code (``ACCESS``).
"""
from __future__ import annotations

import inspect
import json
import os
import random
import sys

import pytest

pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# item function -> {buffer parameter: "r" / "w" / "rw"}: the buffers whose regions other
# items also touch (read-only inputs, per-token outputs and per-chunk rows of partial sums
# or of the undo log are never shared by two units and are left out)
ACCESS = {
    # forward queue walk
    "_gather_item": dict(bank_ptr="r", u_ptr="w", i_ptr="w"),
    "_mix_item": dict(u_ptr="r", i_ptr="r", d_ptr="w"),
    "_write_item": dict(bank_ptr="rw", d_ptr="r"),
    # reverse queue walk
    "_gather_item_b": dict(vmr_ptr="w"),
    "_mix1_item": dict(vmr_ptr="r", d_ptr="w", dd_ptr="w"),
    "_dw_item": dict(dB_ptr="r", d_ptr="r", dd_ptr="rw"),
    "_mix2_item": dict(vmr_ptr="r", d_ptr="r", dd_ptr="r", dr_ptr="w"),
    "_dev_item": dict(dr_ptr="r"),
    "_group_program": dict(dB_ptr="rw", dr_ptr="r"),   # a dB item's tiles (inline)
}
RECORD = "record: "


# ---------------------------------------------------------------- interpreter side

def _record_walks() -> dict:
    """Run both queue walks (training forward, then the backward with and without what the
    forward hands over) under the interpreter, recording their items."""
    import torch
    from sdm_inductor.kernels import host
    from sdm_inductor.kernels.backward import queue_walk as qb
    from sdm_inductor.kernels.common import counts
    from sdm_inductor.kernels.forward import queue_walk as qf
    from sdm_inductor.testing import make_inputs

    # 2 streams x 3 column blocks (6 groups), 4 chunks, several items of each kind
    host.CONFIG.update(WALK="queue", BD_STEP=16, BD_STEP_B=16, BD_GROUP=16, MB_MIX=16,
                       TB_MIX=16, MB_QUEUE_B=16, TB_QUEUE_B=16, NG_STEP=8, NG_GROUP=8,
                       KW_STEP=1, KW_GROUP=1, QUEUE_DB_TILES=2)
    ins = make_inputs(P=2, T=50, W=3, R=2, hd=40, slots_per_stream=12, repeats=True,
                      per_write_gate=True, seed=3)
    C = 16
    events: list = []

    def value(x):   # an int, a constexpr or an interpreter scalar (pointers included)
        if isinstance(getattr(x, "value", None), int):
            return x.value
        if isinstance(x, int):
            return x
        data = getattr(getattr(x, "handle", None), "data", None)
        return None if data is None or data.size != 1 else int(data.reshape(-1)[0])

    def wrap(module, name, label):
        orig = getattr(module, name)
        params = list(inspect.signature(orig.fn).parameters)

        def item(*args):
            kw = {n: value(a) for n, a in zip(params, args)}
            events.append(("item", label, kw))
            return orig(*args)
        setattr(module, name, item)

    # (items of the reverse walk also wait inside, through ``counts._depend``)
    for m in (qf, qb, counts):
        m._await_count = lambda ptr, target: events.append(("wait", value(ptr), value(target)))
        m._finish = lambda ptr: events.append(("finish", value(ptr)))
    for name in ("_gather_item", "_mix_item", "_write_item"):
        wrap(qf, name, name)
    wrap(qb, "_gather_item", "_gather_item_b")
    for name in ("_mix1_item", "_dw_item", "_mix2_item", "_dev_item", "_group_program"):
        wrap(qb, name, name)
    walks = {}
    args = tuple(ins)[1:]
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(ins.v.shape, generator=gen)
    dM = torch.randn(ins.bank.shape, generator=gen)
    bank = ins.bank.clone()
    _, rows, scales, kept = host.forward_kept(bank, *args, C, "none", True)
    handed = kept.tensors()
    walks["forward"], events[:] = list(events), []
    for name, given in (("reverse", []), ("reverse, handed over", handed)):
        host.backward(dy, dM, bank, rows, scales, *args, C, "none", False, given)
        walks[name], events[:] = list(events), []
    ngt = -(-C * (3 + 2) // host.CONFIG["NG_GROUP"])   # dB tiles per segment: C * E / NG
    return {k: _items(v, ngt, host.CONFIG["BD_STEP"]) for k, v in walks.items()}


def _items(events: list, ngt: int, bd: int) -> list:
    """The recorded events as items in ticket order: the item function, its unit (kind,
    chunk, stream, column block), the regions it touches, its waits (count address,
    target) and the count it raises. An item is the events up to its count's raise (a
    reverse dB item: its tiles); a count is its address."""
    items, calls, waits = [], [], []
    for ev in events:
        if ev[0] == "wait":
            waits.append([ev[1], ev[2]])
        elif ev[0] == "item":
            calls.append((ev[1], ev[2]))
        else:
            label, kw = calls[0]
            if label == "_group_program":   # a dB tile: its stream by its index
                p, cb = kw["pid"] // ngt, kw["pb"]
            elif label == "_mix_item":      # handed its first column, not its block
                p, cb = kw["p"], kw["c0"] // bd
            else:
                p, cb = kw["p"], kw["cb"]
            regions = sorted({(mode, args[name], p, cb) for lab, args in calls
                              for name, mode in ACCESS[lab].items()})
            items.append(dict(label=label, unit=[label, kw["c"], p, cb], regions=regions,
                              waits=waits, count=ev[1]))
            calls, waits = [], []
    assert not calls, "an item without its count"
    return items


# ---------------------------------------------------------------- scheduler side

def _conflicts(items: list) -> list:
    """For each item, the items of smaller ticket it must not run beside or before."""
    out = []
    for i, x in enumerate(items):
        mine = [(m, r) for m, *r in x["regions"]]
        need = set()
        for j in range(i):
            y = items[j]
            if y["unit"] == x["unit"]:
                continue
            for ym, *yr in y["regions"]:
                if any(r == yr and ("w" in m or "w" in ym) for m, r in mine):
                    need.add(j)
                    break
        out.append(need)
    return out


def _run_schedule(items: list, conflicts: list, programs: int, rng: random.Random) -> str | None:
    """One random order of ``items`` over ``programs`` programs that the waits allow:
    None if it holds, else what went wrong."""
    counts: dict = {}
    state = [None] * programs   # None (idle), ("wait", i) or ("run", i)
    done = [False] * len(items)
    ticket = 0

    def ready(i):
        return all(counts.get(c, 0) >= target for c, target in items[i]["waits"])

    while True:
        moves = []
        for p, s in enumerate(state):
            if s is None:
                if ticket < len(items):
                    moves.append((p, "take"))
            elif s[0] == "wait" and ready(s[1]):
                moves.append((p, "start"))
            elif s[0] == "run":
                moves.append((p, "finish"))
        if not moves:
            if all(done):
                return None
            return "deadlock: " + ", ".join(
                f"{items[s[1]]['unit']} waits {items[s[1]]['waits']}" for s in state if s)
        p, move = rng.choice(moves)
        if move == "take":
            state[p] = ("wait", ticket)
            ticket += 1
        elif move == "start":
            i = state[p][1]
            early = [j for j in conflicts[i] if not done[j]]
            if early:
                return (f"item {i} {items[i]['unit']} started before item {early[0]} "
                        f"{items[early[0]]['unit']} finished (shared {items[i]['regions']})")
            state[p] = ("run", i)
        else:
            i = state[p][1]
            done[i] = True
            counts[items[i]["count"]] = counts.get(items[i]["count"], 0) + 1
            state[p] = None


def _check_orders(items: list, rounds: int, seed: int) -> str | None:
    conflicts = _conflicts(items)
    rng = random.Random(seed)
    for r in range(rounds):
        bad = _run_schedule(items, conflicts, rng.choice((2, 3, 5, 16, 64)), rng)
        if bad:
            return f"order {r}: {bad}"
    return None


def _job(item) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return dict(argv=[sys.executable, os.path.abspath(__file__)], env=env, timeout=900, cost=45,
                warm=True)


@pytest.mark.background(job=_job)
def test_queue_walk_protocols_hold_in_every_order(background):
    """The forward queue walk, and the reverse one with and without what the forward
    hands over, in 200 random orders each. Then the check fails where it should: without
    the first products' wait of the handed-over reverse walk (the second products of chunk
    c + 2, the last readers of the delta buffers they overwrite), some order runs them too
    early."""
    proc = background()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith(RECORD)]
    recorded = json.loads(line[len(RECORD):])
    forward = {"_gather_item", "_mix_item", "_write_item"}
    reverse = {"_mix1_item", "_dw_item", "_mix2_item", "_dev_item", "_group_program"}
    kinds = {"forward": forward, "reverse": reverse | {"_gather_item_b"},
             "reverse, handed over": reverse}   # (handed over: no gather items)
    for seed, (walk, items) in enumerate(recorded.items()):
        assert {x["label"] for x in items} == kinds[walk], walk
        assert len({tuple(x["unit"]) for x in items}) > 60, "too few units to mean much"
        bad = _check_orders(items, rounds=200, seed=seed)
        assert bad is None, f"{walk}: {bad}"
    mutant = [dict(x) for x in recorded["reverse, handed over"]]
    for x in mutant:
        if x["label"] == "_mix1_item":
            x["waits"] = []
    bad = _check_orders(mutant, rounds=200, seed=7)
    assert bad is not None and "_mix1_item" in bad, bad


if __name__ == "__main__":   # the interpreter half, in its own process
    from sdm_inductor.testing import quick_interpreter
    quick_interpreter()
    print(RECORD + json.dumps(_record_walks()))
