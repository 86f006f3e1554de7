"""``phase1.reference_groups`` (the torch form of ``entry_groups``): the backward's dB groups,
with headers by position or packed to the front of each segment (``pack``). Runs on
CPU without Triton's interpreter; the kernel is compared against this form in
``test_kernels_interpret.py`` (``case_entry_groups``), and the dB launches that read both
layouts against the oracle there and bitwise against each other in ``test_cuda.py``."""
from __future__ import annotations

import types

import torch

from references import reference_groups


# each header field and its value in an empty header (``phase1.Groups``)
EMPTY_HEADER = (("slot", -1), ("length", 0), ("n_w", 0), ("decay", 1.0), ("pos", -1),
                ("tok0", 0), ("ev0", 0.0))


def random_plan(B: int, C: int, E: int, seed: int):
    """A plan's group fields for random groups: each segment's sorted positions cut into
    groups of 1-4 members, ``perm`` a random entry order (fields in entry order, as
    ``phase1.plan`` keeps them)."""
    gen = torch.Generator().manual_seed(seed)
    CE = C * E
    perm = torch.stack([torch.randperm(CE, generator=gen) for _ in range(B)])
    gs = torch.empty(B, CE, dtype=torch.int64)
    na, nw = torch.zeros(B, CE, dtype=torch.int64), torch.zeros(B, CE, dtype=torch.int64)
    for b in range(B):
        pos = 0
        while pos < CE:
            n = min(CE - pos, int(torch.randint(1, 5, (), generator=gen)))
            gs[b, pos:pos + n] = pos
            na[b, pos:pos + n] = n
            nw[b, pos:pos + n] = int(torch.randint(0, n + 1, (), generator=gen))
            pos += n
    slot = gs * 7 % 1000   # distinct per group within a segment
    # in entry order and in ``phase1.plan``'s dtypes (int32 indices, fp32 weights)
    to_entries = lambda x: torch.empty_like(x).scatter_(1, perm, x).reshape(B, C, E)
    ints = (to_entries(x).to(torch.int32) for x in (gs, slot, na, nw))
    return types.SimpleNamespace(
        B=B, C=C, E=E, perm=perm.to(torch.int32), **dict(zip(("gs", "slot", "na", "nw"), ints)),
        decay=to_entries(torch.rand(B, CE, generator=gen)),
        ev=to_entries(torch.randn(B, CE, generator=gen)))


def test_packed_headers_are_the_group_starts_in_order():
    pl = random_plan(B=3, C=8, E=5, seed=0)
    by_pos, packed = reference_groups(pl, pack=False), reference_groups(pl, pack=True)
    assert torch.equal(by_pos.tok, packed.tok) and torch.equal(by_pos.ev, packed.ev)
    CE = pl.C * pl.E
    for b in range(pl.B):
        starts = torch.nonzero(by_pos.slot[b] >= 0).flatten()
        n = len(starts)
        assert torch.equal(by_pos.pos[b][starts], starts.to(torch.int32))
        assert (by_pos.pos[b][by_pos.slot[b] < 0] == -1).all()
        for name, fill in EMPTY_HEADER:
            a, p = getattr(by_pos, name)[b], getattr(packed, name)[b]
            assert torch.equal(p[:n], a[starts]), name
            assert (p[n:] == fill).all(), name
        # the first member's token and weight in the header are tok / ev at its position
        assert torch.equal(packed.tok0[b, :n], packed.tok[b][packed.pos[b, :n].long()])
        assert torch.equal(packed.ev0[b, :n], packed.ev[b][packed.pos[b, :n].long()])
        # every member position belongs to exactly one packed group
        covered = torch.zeros(CE, dtype=torch.int64)
        for i in range(n):
            covered[packed.pos[b, i]:packed.pos[b, i] + packed.length[b, i]] += 1
        assert (covered == 1).all()


def test_split_headers_put_longer_groups_first_and_single_members_from_the_end():
    """``pack=2``: groups of several members packed to the front in position order, those
    of one member from the row's end (the last column holds the first of them), empty
    headers between; the same groups as by position, and tok / ev untouched."""
    pl = random_plan(B=3, C=8, E=5, seed=1)
    by_pos, split = reference_groups(pl, pack=0), reference_groups(pl, pack=2)
    assert torch.equal(by_pos.tok, split.tok) and torch.equal(by_pos.ev, split.ev)
    CE = pl.C * pl.E
    kinds = set()
    for b in range(pl.B):
        starts = torch.nonzero(by_pos.slot[b] >= 0).flatten()
        longer = starts[by_pos.length[b][starts] > 1]
        ones = starts[by_pos.length[b][starts] == 1]
        n1, n2 = len(longer), len(ones)
        kinds |= {k for k, n in (("longer", n1), ("one", n2)) if n}
        for name, fill in EMPTY_HEADER:
            a, s = getattr(by_pos, name)[b], getattr(split, name)[b]
            assert torch.equal(s[:n1], a[longer]), name
            assert torch.equal(s[CE - n2:].flip(0), a[ones]), name
            assert (s[n1:CE - n2] == fill).all(), name
        assert (split.length[b][:n1] > 1).all() and (split.length[b][CE - n2:] == 1).all()
    assert kinds == {"one", "longer"}   # random_plan made both kinds
