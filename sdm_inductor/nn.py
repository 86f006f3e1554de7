"""``SparseDeltaMemory``: a multi-head SDM layer on top of ``torch.ops.sdm.write_read``.

Per token ``x_t`` and head ``h`` the layer computes

- write and read addresses by *product keys*: two query halves score two sub-key
  tables of ``n`` keys each (``slots_per_head = n * n``), top-``sub_top_k`` of each,
  then top-``top_k`` over the ``sub_top_k**2`` sums; a slot is ``i1 * n + i2``. The
  ``(i1, i2)`` pairs are distinct, so a token never writes a slot twice (docs/spec.md
  section 1: no repeated slots, which keeps the naive loop and the op identical);
- write and read weights: softmax over the ``top_k`` selected scores;
- value ``v = W_v x``, write strength ``beta = sigmoid(W_b x)`` and log-decay
  ``g = -exp(A_log) * softplus(W_a x + dt_bias)``, computed inside the op
  (``sdm::write_read_gated``, from the projections' raw ``[B, T, H]`` outputs); with
  ``key_weighted_decay`` each written slot decays by ``g * k_val`` (its own write weight:
  a slot that is mostly overwritten forgets more), computed before ``sdm::write_read``;
- one SDM stream per (batch, head): stream ``b * H + h`` (docs/spec.md section 2) owns the
  rows ``[(b*H + h) * slots_per_head, (b*H + h + 1) * slots_per_head)`` of a per-batch
  private copy (``torch.ops.sdm.expand_bank``) of the learned ``memory`` parameter
  ``[H * slots_per_head, head_dim]``;
- readings merged over heads, optionally gated by ``silu(W_o_gate x)``, projected back
  to ``d_model``.

``naive=True`` runs the very same layer with the recurrence written as the plain token
loop of docs/spec.md section 1 (the code ``torch.compile``'s pattern rewrite recognises),
instead of the fused op. A :class:`SDMCache` holds the advanced bank for token-by-token
decoding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import api
from .validation import MAX_CHUNK, MAX_SLOTS_PER_TOKEN, MIN_CHUNK, SDMArgumentError

__all__ = ["SparseDeltaMemory", "SDMCache", "sdm_token_loop"]


def _bad(arg: str, expected: str, got) -> SDMArgumentError:
    return SDMArgumentError(f"SparseDeltaMemory: argument '{arg}': expected {expected}, got {got!r}")


def _positive_int(arg: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(arg, "a positive int", value)
    return value


@dataclass
class SDMCache:
    """Decode state of one :class:`SparseDeltaMemory`: the bank after the tokens seen so far.

    ``bank`` is ``[batch * num_heads * slots_per_head, head_dim]`` (``None`` before the
    first call: the layer starts from its learned ``memory``). The layer replaces it on
    every call it is passed to, so one object follows a whole generation.
    """
    bank: Tensor | None = None
    batch: int | None = None
    seen_tokens: int = 0


def sdm_token_loop(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor,
                   g: Tensor, q_idx: Tensor, q_val: Tensor):
    """docs/spec.md section 1 as a plain PyTorch loop over tokens, one stream after the other.

    ``bank [S, hd]``; ``k_idx/k_val [P, T, W]``, ``v [P, T, hd]``, ``beta [P, T]``,
    ``g [P, T, 1 or W]``, ``q_idx/q_val [P, T, R]``; the write slots of a token must be
    distinct and streams touch disjoint rows (so running them one after the other is
    exact). Returns ``(readings [P, T, hd], final bank)``. Ordinary indexing /
    ``index_put`` / mul+sum on purpose: this is the code a user would write for one
    sequence, and the code ``sdm_inductor.patterns`` turns into the fused op.
    """
    # gates in the bank dtype, like the oracle (index_put needs one dtype)
    beta, g = beta.to(bank.dtype), g.to(bank.dtype)
    P, T = k_idx.shape[:2]
    M = bank
    readings = []
    for p in range(P):
        outs = []
        for t in range(T):
            idx = k_idx[p, t]
            rows = M[idx]                                    # [W, hd], before this token
            decayed = rows * torch.exp(g[p, t])[:, None]     # only the written rows decay
            retrieved = (k_val[p, t][:, None] * decayed).sum(0)
            delta = beta[p, t] * (v[p, t] - retrieved)
            M = M.index_put((idx,), decayed + k_val[p, t][:, None] * delta[None, :])
            outs.append((q_val[p, t][:, None] * M[q_idx[p, t]]).sum(0))  # read after the write
        readings.append(torch.stack(outs) if outs else v.new_zeros(0, bank.shape[1], dtype=bank.dtype))
    if not readings:   # no streams
        return v.new_zeros(0, T, bank.shape[1], dtype=bank.dtype), M
    return torch.stack(readings), M


class SparseDeltaMemory(nn.Module):
    """Multi-head Sparse Delta Memory layer: ``[B, T, d_model] -> [B, T, d_model]``.

    Args:
        d_model: model width.
        num_heads: heads ``H``; each (batch, head) is one SDM stream.
        head_dim: bank row width ``hd`` (default ``d_model // num_heads``).
        slots_per_head: bank rows per head, a perfect square ``n * n`` (product keys).
        top_k: slots written and read per token and head (``W = R``), 1..256.
        sub_top_k: candidates kept per sub-key factor (default ``top_k``, at most ``n``;
            ``sub_top_k**2 >= top_k``).
        key_dim: width of each query half and sub-key (default 32).
        output_gate: multiply the readings by ``silu(W_gate x)`` before the projection.
        key_weighted_decay: one log-decay per written slot, ``g * k_val`` (else one per token).
        chunk_size: the op's chunk length (16..256).
        naive: compute the recurrence with :func:`sdm_token_loop` instead of the op.
    """

    def __init__(self, d_model: int, num_heads: int = 4, head_dim: int | None = None,
                 slots_per_head: int = 1024, top_k: int = 16, sub_top_k: int | None = None,
                 key_dim: int = 32, output_gate: bool = False, key_weighted_decay: bool = False,
                 chunk_size: int = 64, naive: bool = False, device=None, dtype=None):
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.num_heads = H = _positive_int("num_heads", num_heads)
        if head_dim is None:
            if d_model % num_heads:
                raise _bad("num_heads", f"a divisor of d_model={d_model} when head_dim is not given",
                           num_heads)
            head_dim = d_model // num_heads
        self.head_dim = hd = _positive_int("head_dim", head_dim)
        self.slots_per_head = _positive_int("slots_per_head", slots_per_head)
        n = math.isqrt(slots_per_head)
        if n * n != slots_per_head or n < 2:
            raise _bad("slots_per_head", "a perfect square n*n with n >= 2 (product keys: n x n "
                       "sub-key pairs)", slots_per_head)
        self.n_sub = n
        self.top_k = _positive_int("top_k", top_k)
        if top_k > min(MAX_SLOTS_PER_TOKEN, slots_per_head):
            raise _bad("top_k", f"at most min({MAX_SLOTS_PER_TOKEN}, slots_per_head={slots_per_head})",
                       top_k)
        sub_top_k = min(top_k, n) if sub_top_k is None else sub_top_k
        self.sub_top_k = _positive_int("sub_top_k", sub_top_k)
        if sub_top_k > n or sub_top_k * sub_top_k < top_k:
            raise _bad("sub_top_k", f"k with k*k >= top_k={top_k} and k <= sqrt(slots_per_head)={n}",
                       sub_top_k)
        self.key_dim = dk = _positive_int("key_dim", key_dim)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) \
                or not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
            raise _bad("chunk_size", f"an int in {MIN_CHUNK}..{MAX_CHUNK}", chunk_size)
        self.chunk_size = chunk_size
        self.output_gate = bool(output_gate)
        self.key_weighted_decay = bool(key_weighted_decay)
        self.naive = bool(naive)

        fk = {"device": device, "dtype": dtype}
        self.k_proj = nn.Linear(d_model, H * 2 * dk, bias=False, **fk)   # write address
        self.q_proj = nn.Linear(d_model, H * 2 * dk, bias=False, **fk)   # read address
        self.v_proj = nn.Linear(d_model, H * hd, bias=False, **fk)
        self.b_proj = nn.Linear(d_model, H, bias=True, **fk)             # write strength
        self.a_proj = nn.Linear(d_model, H, bias=False, **fk)            # decay input
        self.gate_proj = nn.Linear(d_model, H * hd, bias=False, **fk) if output_gate else None
        self.o_proj = nn.Linear(H * hd, d_model, bias=False, **fk)
        self.sub_keys = nn.Parameter(torch.empty(H, 2, n, dk, **fk))
        self.A_log = nn.Parameter(torch.empty(H, **fk))
        self.dt_bias = nn.Parameter(torch.empty(H, **fk))
        self.memory = nn.Parameter(torch.empty(H * slots_per_head, hd, **fk))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for lin in (self.k_proj, self.q_proj, self.v_proj, self.b_proj, self.a_proj,
                    self.gate_proj, self.o_proj):
            if lin is not None:
                lin.reset_parameters()
        nn.init.normal_(self.sub_keys, std=self.key_dim ** -0.5)
        # decay rates exp(A_log) in [1, 16] and time steps softplus(dt_bias) in [1e-3, 1e-1],
        # the Mamba-2 / Gated DeltaNet initialisation
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        dt = torch.exp(torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))   # inverse softplus
        nn.init.normal_(self.memory, std=0.02)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"slots_per_head={self.slots_per_head}, top_k={self.top_k}, "
                f"sub_top_k={self.sub_top_k}, key_dim={self.key_dim}, output_gate={self.output_gate}, "
                f"key_weighted_decay={self.key_weighted_decay}, chunk_size={self.chunk_size}, "
                f"naive={self.naive}")

    # ------------------------------------------------------------------ addressing

    def _sub_scores(self, z: Tensor) -> Tensor:
        """The two sub-key tables' scores of ``z [B, T, H*2*dk]``: ``[B, T, H, 2, n]``."""
        B, T = z.shape[:2]
        z = z.view(B, T, self.num_heads, 2, self.key_dim)
        return torch.einsum("bthfd,hfnd->bthfn", z, self.sub_keys) * self.key_dim ** -0.5

    def _address(self, z: Tensor):
        """Product-key top-k: ``z [B, T, H*2*dk]`` -> (slots [B, T, H, k] long, weights)."""
        n, kk, k = self.n_sub, self.sub_top_k, self.top_k
        scores = self._sub_scores(z)
        s1, i1 = scores[..., 0, :].topk(kk, dim=-1)            # [B, T, H, kk]
        s2, i2 = scores[..., 1, :].topk(kk, dim=-1)
        pair = (s1[..., :, None] + s2[..., None, :]).flatten(-2)  # [B, T, H, kk*kk]
        top, pos = pair.topk(k, dim=-1)
        slot = i1.gather(-1, pos // kk) * n + i2.gather(-1, pos % kk)
        return slot, torch.softmax(top.float(), dim=-1).to(z.dtype)

    def _streams(self, x: Tensor, raw_gates: bool = False):
        """Per-stream inputs ``[B*H, T, *]`` of the SDM recurrence for ``x [B, T, d_model]``.

        ``raw_gates``: instead of ``beta`` and ``g``, the raw gate inputs for
        ``sdm::write_read_gated``: ``(k_idx, k_val, v, b, a, A_log, dt_bias, q_idx, q_val)``
        with ``b``, ``a`` the projections' own ``[B, T, H]`` outputs (the op reads them
        token-major, no head split) and ``A_log``, ``dt_bias`` per stream ``[B*H]``."""
        B, T, _ = x.shape
        H, hd = self.num_heads, self.head_dim

        def per_stream(t: Tensor) -> Tensor:  # [B, T, H, *] -> [B*H, T, *]
            return t.transpose(1, 2).reshape(B * H, T, *t.shape[3:])

        # stream b*H + h owns rows [(b*H + h) * sph, ...): its slots offset by that base
        base = (torch.arange(B * H, device=x.device) * self.slots_per_head).view(B, 1, H, 1)
        k_slot, k_val = self._address(self.k_proj(x))
        q_slot, q_val = self._address(self.q_proj(x))
        v = self.v_proj(x).view(B, T, H, hd)
        if raw_gates:
            # stream b*H + h takes head h's parameters: [H] -> [B*H] (size P, no token pass;
            # fp32 like the gate math, so their gradients sum over the batch in fp32)
            return (per_stream(k_slot + base), per_stream(k_val), per_stream(v), self.b_proj(x),
                    self.a_proj(x), self.A_log.float().repeat(B), self.dt_bias.float().repeat(B),
                    per_stream(q_slot + base), per_stream(q_val))
        beta = torch.sigmoid(self.b_proj(x).float())                            # [B, T, H]
        g = -torch.exp(self.A_log.float()) * F.softplus(self.a_proj(x).float() + self.dt_bias.float())
        g = g[..., None] * k_val.float() if self.key_weighted_decay else g[..., None]
        return (per_stream(k_slot + base), per_stream(k_val), per_stream(v), per_stream(beta),
                per_stream(g), per_stream(q_slot + base), per_stream(q_val))

    # ------------------------------------------------------------------ forward

    def initial_bank(self, batch: int) -> Tensor:
        """The per-batch private copy of the learned bank: ``[batch * H * sph, hd]``."""
        return torch.ops.sdm.expand_bank(self.memory, batch)

    def new_cache(self) -> SDMCache:
        return SDMCache()

    def forward(self, x: Tensor, cache: SDMCache | None = None) -> Tensor:
        """``x [B, T, d_model] -> [B, T, d_model]``. With ``cache``, start from its bank
        (the learned one on the first call) and leave the advanced bank in it."""
        self._check_x(x)
        B, T, _ = x.shape
        bank = self._start_bank(cache, B)
        if not self.naive and not self.key_weighted_decay:
            # per-token gates: the op computes beta and g from the raw projections inside
            # the kernel that reads them (CUDA: Phase 1's prep kernel), no pass of their own
            k_idx, k_val, v, b, a, A_log, dt_bias, q_idx, q_val = self._streams(x, raw_gates=True)
            readings, final = api.write_read_gated(
                bank, k_idx, k_val, v, b, a, A_log, dt_bias, q_idx, q_val,
                chunk_size=self._chunk_for(T), slots_per_stream=self.slots_per_head)
        elif self.naive:
            k_idx, k_val, v, beta, g, q_idx, q_val = self._streams(x)
            readings, final = sdm_token_loop(bank, k_idx, k_val, v, beta, g, q_idx, q_val)
        else:
            # key_weighted_decay: one log-decay per write (g * k_val), not the per-token form
            # the gated op computes; the gates stay torch ops before write_read here
            k_idx, k_val, v, beta, g, q_idx, q_val = self._streams(x)
            readings, final = api.write_read(
                bank, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size=self._chunk_for(T),
                slots_per_stream=self.slots_per_head)
        if cache is not None:
            cache.bank, cache.batch, cache.seen_tokens = final, B, cache.seen_tokens + T
        H, hd = self.num_heads, self.head_dim
        y = readings.view(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
        y = y.to(x.dtype)
        if self.gate_proj is not None:
            y = y * F.silu(self.gate_proj(x))
        return self.o_proj(y)

    def _chunk_for(self, T) -> int:
        """A short call (a decode step) pads to a smaller chunk: same result (the chunked
        form is chunk-size invariant), less padded work. A symbolic T (export, dynamic
        compile) keeps the configured chunk so that nothing specializes on T."""
        if not isinstance(T, int) or T >= self.chunk_size:
            return self.chunk_size
        return max(MIN_CHUNK, 1 << max(T - 1, 0).bit_length())

    def _check_x(self, x) -> None:
        """``x`` as the projections take it: named here, not by a matmul's dtype error."""
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise _bad("x", f"a tensor [batch, tokens, d_model={self.d_model}]",
                       list(x.shape) if isinstance(x, Tensor) else type(x).__name__)
        p = self.memory
        if not x.is_floating_point():
            raise _bad("x", f"a floating-point tensor (the layer's parameters are {p.dtype})",
                       x.dtype)
        if x.device != p.device:
            raise _bad("x", f"device {p.device} (the layer's parameters')", x.device)
        # under autocast the projections cast x themselves
        if x.dtype != p.dtype and not torch.is_autocast_enabled(x.device.type):
            raise _bad("x", f"dtype {p.dtype} like the layer's parameters (or autocast)", x.dtype)

    def _start_bank(self, cache: SDMCache | None, batch: int) -> Tensor:
        if cache is not None and not isinstance(cache, SDMCache):
            raise _bad("cache", "an SDMCache (layer.new_cache()) or None", type(cache).__name__)
        if cache is None or cache.bank is None:
            return self.initial_bank(batch)
        if cache.batch != batch:
            raise _bad("x", f"batch {cache.batch} (the batch the cache was started with)", batch)
        bank, p = cache.bank, self.memory
        want = [batch * self.num_heads * self.slots_per_head, self.head_dim]
        if not isinstance(bank, Tensor) or list(bank.shape) != want:
            raise _bad("cache", f"the bank of this layer's cache: [batch * num_heads * "
                       f"slots_per_head, head_dim] = {want} (a cache of another layer?)",
                       list(bank.shape) if isinstance(bank, Tensor) else type(bank).__name__)
        if bank.device != p.device or bank.dtype != p.dtype:
            raise _bad("cache", f"a {p.dtype} bank on {p.device} (like the layer's memory)",
                       f"{bank.dtype} on {bank.device}")
        return bank
