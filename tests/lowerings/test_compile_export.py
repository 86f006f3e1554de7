"""The op under torch.compile (no graph break, no recompile for a new T) and torch.export."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import sdm_inductor
from sdm_inductor.testing import make_inputs, rel_err


def loss_fn(bank, k_idx, k_val, v, beta, g, q_idx, q_val):
    y, M = sdm_inductor.write_read(bank, k_idx, k_val, torch.tanh(v), torch.sigmoid(beta), g,
                                   q_idx, q_val, chunk_size=16, slots_per_stream=32)
    return y.square().mean() + M.square().mean()


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_fullgraph_aot_eager_forward_backward(fresh_dynamo):
    """AOTAutograd sees one forward and one backward op; values and gradients equal eager."""
    ins = make_inputs(2, 21, hd=8, slots_per_stream=32)
    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    a, b = ins.leaves(), ins.leaves()
    loss_fn(*a).backward()
    compiled(*b).backward()
    for x, y in zip(a, b):
        if x.grad is not None:
            assert torch.equal(x.grad, y.grad)


def test_dynamic_T_and_P_do_not_recompile(fresh_dynamo):
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loss_fn, backend=counter, fullgraph=True, dynamic=True)
    for P, T in ((2, 9), (2, 23), (3, 40), (5, 71)):  # symbolic T and P (and bank rows)
        ins = make_inputs(P, T, hd=8, slots_per_stream=32, seed=T)
        assert torch.equal(compiled(*ins), loss_fn(*ins))
    assert counter.frame_count == 1


def test_mark_dynamic_in_place_api(fresh_dynamo):
    """The 2.0.0 in-place interface under fullgraph compile: the bank input is mutated."""
    counter = CompileCounterWithBackend("aot_eager")

    def step(memory, k_idx, k_val, v, beta, g, q_idx, q_val):
        return sdm_inductor.sdm_write_read(memory, k_idx, k_val, v, beta, g, q_idx, q_val,
                                           chunk_size=16, num_memory_slots=32, num_parallel=2)

    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for T in (12, 30, 45):
        ins = make_inputs(2, T, hd=8, slots_per_stream=32, seed=T)
        flat = [t.reshape(2 * T, *t.shape[2:]) for t in ins[1:]]
        for t in flat:
            torch._dynamo.mark_dynamic(t, 0)
        m1, m2 = ins.bank.clone(), ins.bank.clone()
        with torch.no_grad():
            y1, y2 = step(m1, *flat), compiled(m2, *flat)
        assert torch.equal(y1, y2) and torch.equal(m1, m2)
    assert counter.frame_count == 1


@pytest.mark.compile
def test_inductor_fullgraph_matches_eager(fresh_dynamo):
    ins = make_inputs(2, 19, hd=8, slots_per_stream=32)
    compiled = torch.compile(loss_fn, fullgraph=True)
    a, b = ins.leaves(), ins.leaves()
    la, lb = loss_fn(*a), compiled(*b)
    la.backward()
    lb.backward()
    assert rel_err(lb, la) < 1e-6
    for x, y in zip(a, b):
        if x.grad is not None:
            assert rel_err(y.grad, x.grad) < 1e-5


class Reader(torch.nn.Module):
    def __init__(self, slots=32, hd=8):
        super().__init__()
        self.register_buffer("bank", torch.randn(slots, hd))
        self.proj = torch.nn.Linear(hd, hd)

    def forward(self, k_idx, k_val, v, beta, g, q_idx, q_val):
        y, _ = sdm_inductor.write_read(self.bank, k_idx, k_val, self.proj(v), beta, g, q_idx,
                                       q_val, chunk_size=16)
        return y


def test_export_dynamic_T_save_load(tmp_path):
    mod = Reader().eval()
    ins = make_inputs(1, 20, hd=8, slots_per_stream=32)
    args = tuple(ins[1:])
    T = torch.export.Dim("T", min=2, max=4096)
    shapes = ({1: T},) * 7
    ep = torch.export.export(mod, args, dynamic_shapes=shapes)
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"
             and "sdm" in str(n.target) and "write_read" in str(n.target)]
    assert len(nodes) == 1, ep.graph
    path = tmp_path / "reader.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path).module()
    for T_ in (20, 53):
        other = make_inputs(1, T_, hd=8, slots_per_stream=32, seed=T_)
        with torch.no_grad():
            assert torch.equal(loaded(*other[1:]), mod(*other[1:]))
