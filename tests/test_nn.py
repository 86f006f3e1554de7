"""SparseDeltaMemory: op mode vs naive token loop, decode cache, gradients, errors."""
from __future__ import annotations

import pytest
import torch

import sdm_inductor
from sdm_inductor.nn import SDMCache, SparseDeltaMemory, sdm_token_loop
from sdm_inductor.reference import sdm_write_read_reference
from sdm_inductor.testing import rel_err

# small enough for 2 CPU cores; T=37 is not a multiple of the chunk (16): padding is hit
B, T, D = 2, 37, 32
SMALL = dict(num_heads=2, head_dim=8, slots_per_head=16, top_k=4, key_dim=8, chunk_size=16)
FULL = dict(SMALL, output_gate=True, key_weighted_decay=True)


def make_layer(seed=0, dtype=torch.float32, **kw):
    torch.manual_seed(seed)
    layer = SparseDeltaMemory(D, **{**SMALL, **kw}).to(dtype)
    with torch.no_grad():  # a livelier bank and decays than the init, so every term matters
        layer.memory.normal_()
        layer.A_log.uniform_(-2, 0)
    return layer


def run(layer, x, naive):
    layer.naive = naive
    cache = SDMCache()
    y = layer(x, cache=cache)
    return y, cache.bank


@pytest.mark.parametrize("kw", [SMALL, FULL], ids=["plain", "gate+kwdecay"])
def test_forward_matches_naive_fp32(kw):
    layer = make_layer(**kw)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        y, M = run(layer, x, naive=False)
        y0, M0 = run(layer, x, naive=True)
    assert y.shape == (B, T, D) and M.shape == (B * 2 * 16, 8)
    assert rel_err(y, y0) < 1e-5, rel_err(y, y0)
    assert rel_err(M, M0) < 1e-5, rel_err(M, M0)
    assert not torch.equal(M, layer.initial_bank(B)), "the bank must advance"


def test_forward_matches_naive_bf16():
    layer = make_layer(dtype=torch.bfloat16, **FULL)
    x = torch.randn(B, T, D, dtype=torch.bfloat16)
    with torch.no_grad():
        y, M = run(layer, x, naive=False)
        y0, M0 = run(layer, x, naive=True)
    assert y.dtype == M.dtype == torch.bfloat16
    assert rel_err(y, y0) < 2e-2, rel_err(y, y0)
    assert rel_err(M, M0) < 2e-2, rel_err(M, M0)


def test_token_loop_is_the_oracle():
    """The naive loop (all streams at once) equals the spec-section-1 oracle."""
    layer = make_layer(**FULL)
    x = torch.randn(B, 9, D)
    with torch.no_grad():
        streams = layer._streams(x)
        bank = layer.initial_bank(B)
        y, M = sdm_token_loop(bank, *streams)
        y0, M0 = sdm_write_read_reference(bank, *streams)
    assert rel_err(y, y0) < 1e-6 and rel_err(M, M0) < 1e-6


def test_streams_are_private_per_batch_and_head():
    """Batch elements never see each other (stream b*H+h owns its rows of its own copy)."""
    layer = make_layer(**FULL)
    x = torch.randn(B, T, D)
    with torch.no_grad():
        y, M = run(layer, x, naive=False)
        y1, M1 = run(layer, x[1:], naive=False)
        k_idx = layer._streams(x)[0]
    assert rel_err(y[1:], y1) < 1e-6
    rows = layer.slots_per_head * layer.num_heads
    assert rel_err(M[rows:], M1) < 1e-6
    owner = k_idx // layer.slots_per_head  # every index lies in its stream's rows
    assert torch.equal(owner, torch.arange(B * 2).view(-1, 1, 1).expand_as(owner))


@pytest.mark.parametrize("naive", [False, True], ids=["op", "naive"])
def test_decode_equals_full_forward(naive):
    layer = make_layer(**FULL)
    layer.naive = naive
    x = torch.randn(B, 11, D)
    with torch.no_grad():
        full_cache = SDMCache()
        y_full = layer(x, cache=full_cache)
        cache = layer.new_cache()
        pieces = [layer(x[:, :4], cache=cache)]                    # a prompt, then token by token
        pieces += [layer(x[:, t:t + 1], cache=cache) for t in range(4, 11)]
    assert cache.seen_tokens == 11
    assert rel_err(torch.cat(pieces, 1), y_full) < 1e-5
    assert rel_err(cache.bank, full_cache.bank) < 1e-5


def _grads(layer, x, naive):
    layer.naive = naive
    layer.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    cache = SDMCache()
    y = layer(x, cache=cache)
    (y * torch.randn_like(y)).sum().add((cache.bank * torch.randn_like(cache.bank)).sum()).backward()
    return {n: p.grad for n, p in layer.named_parameters()}


def test_gradients_reach_every_parameter_and_match_naive():
    layer = make_layer(**FULL)
    x = torch.randn(B, 21, D)
    grads = _grads(layer, x, naive=False)
    ref = _grads(layer, x, naive=True)
    assert set(grads) == {n for n, _ in layer.named_parameters()}
    for name, g in grads.items():
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name
        assert rel_err(g, ref[name]) < 1e-5, (name, rel_err(g, ref[name]))


def test_gradients_match_naive_bf16():
    layer = make_layer(dtype=torch.bfloat16, **FULL)
    x = torch.randn(B, 21, D, dtype=torch.bfloat16)
    grads = _grads(layer, x, naive=False)
    ref = _grads(layer, x, naive=True)
    for name, g in grads.items():
        assert g.dtype == torch.bfloat16, name
        assert rel_err(g, ref[name]) < 3e-2, (name, rel_err(g, ref[name]))


@pytest.mark.parametrize("kwargs,arg", [
    (dict(d_model=0), "d_model"),
    (dict(num_heads=3, head_dim=None), "num_heads"),   # 32 % 3 and no head_dim
    (dict(slots_per_head=15), "slots_per_head"),       # not a square
    (dict(slots_per_head=1), "slots_per_head"),
    (dict(top_k=17), "top_k"),                         # more than the 16 slots
    (dict(top_k=0), "top_k"),
    (dict(top_k=9, sub_top_k=2), "sub_top_k"),         # 2*2 < 9 candidates
    (dict(sub_top_k=5), "sub_top_k"),                  # more than sqrt(16) sub-keys
    (dict(chunk_size=8), "chunk_size"),
    (dict(key_dim=-1), "key_dim"),
    (dict(head_dim=2.5), "head_dim"),
])
def test_malformed_construction(kwargs, arg):
    kw = {"d_model": D, **SMALL, **kwargs}
    with pytest.raises(sdm_inductor.SDMArgumentError, match=f"argument '{arg}': expected"):
        SparseDeltaMemory(**kw)


def test_malformed_calls():
    layer = make_layer()
    with pytest.raises(sdm_inductor.SDMArgumentError, match=r"argument 'x': expected .* got \[2, 5, 31\]"):
        layer(torch.randn(2, 5, 31))
    with pytest.raises(sdm_inductor.SDMArgumentError, match="argument 'cache'"):
        layer(torch.randn(2, 5, D), cache={"bank": None})
    cache = layer.new_cache()
    with torch.no_grad():
        layer(torch.randn(2, 5, D), cache=cache)
        with pytest.raises(sdm_inductor.SDMArgumentError, match="argument 'x': expected batch 2"):
            layer(torch.randn(3, 1, D), cache=cache)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_layer_matches_naive():
    layer = make_layer(**FULL).cuda()
    x = torch.randn(B, T, D, device="cuda")
    grads_ref = _grads(layer, x, naive=True)
    with torch.no_grad():
        y0, M0 = run(layer, x, naive=True)
        y, M = run(layer, x, naive=False)
    assert rel_err(y, y0) < 1e-4 and rel_err(M, M0) < 1e-4
    for name, g in _grads(layer, x, naive=False).items():
        assert rel_err(g, grads_ref[name]) < 1e-3, name
