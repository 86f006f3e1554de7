"""An op called from a compiled graph runs its host code under CPython's own frame
evaluation (``sdm_inductor.frames``), and computes what it computes eagerly."""
from __future__ import annotations

import torch

import sdm_inductor
from sdm_inductor import frames, ops
from sdm_inductor.testing import make_inputs

SEEN: list = []
DYNAMOS: list = []   # whether the probe saw Dynamo's own function installed


@torch.library.custom_op("sdm_test::probe", mutates_args=())
def _probe(x: torch.Tensor) -> torch.Tensor:
    SEEN.append(("probe", frames.installed()))
    DYNAMOS.append(frames.installed_function() == frames._dynamo_function())
    return x.clone()


@_probe.register_fake
def _(x):
    return torch.empty_like(x)


class _Recording:
    """The CPU implementation, noting whether Dynamo's frame function is installed."""

    def __init__(self, impl):
        self.impl = impl

    def forward(self, *args):
        SEEN.append(("sdm", frames.installed()))
        return self.impl.forward(*args)


def test_op_body_runs_plain_frames_inside_a_compiled_graph(monkeypatch):
    monkeypatch.setitem(ops.IMPLS, "cpu", _Recording(ops.IMPLS["cpu"]))
    ins = make_inputs(P=2, T=40, hd=8, slots_per_stream=16)

    def step(bank, *rest):
        y, final = sdm_inductor.write_read(bank, *rest, chunk_size=16, slots_per_stream=16)
        return _probe(y), final

    SEEN.clear()
    want = step(*ins)
    assert SEEN == [("sdm", False), ("probe", False)]
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    compiled(*ins)
    SEEN.clear()
    DYNAMOS.clear()
    got = compiled(*ins)
    # the probe (a custom op without plain_frames) shows Dynamo's function installed
    # while the graph runs (the one plain_frames recognizes); the sdm op's body does not
    assert SEEN == [("sdm", False), ("probe", True)]
    assert DYNAMOS == [True]
    assert not frames.installed()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
