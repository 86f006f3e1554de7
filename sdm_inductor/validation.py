"""Argument checks shared by every entry point: each failure names the argument,
what was expected and what came, and happens before any work (spec section 4)."""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch._subclasses.fake_tensor import is_fake

from . import quant

MIN_CHUNK, MAX_CHUNK = 16, 256
MAX_SLOTS_PER_TOKEN = 256
BANK_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


class SDMArgumentError(ValueError):
    """A malformed sdm call. Raised before any work; the bank is left untouched."""


def _fail(arg: str, expected: str, got) -> None:
    raise SDMArgumentError(f"sdm: argument '{arg}': expected {expected}, got {got}")


def _shape(t: Tensor):
    return list(t.shape)


@dataclass(frozen=True)
class Names:
    """How an entry point spells the arguments whose names differ between the entry
    points, so that the shared checks name them as its caller did."""
    bank: str = "bank"
    slots_per_stream: str = "slots_per_stream"
    streams: str | None = None   # the argument giving the stream count (None: k_idx.shape[0])


# the ops and the functional forms (``write_read``, ``write_read_gated``)
OP_NAMES = Names()
# the 2.0.0 interface ``sdm_write_read``
API_NAMES = Names(bank="memory", slots_per_stream="num_memory_slots", streams="num_parallel")


def check_tensors(named) -> None:
    """Each ``(name, value)`` is a tensor."""
    for name, t in named:
        if not isinstance(t, Tensor):
            _fail(name, "a tensor", type(t).__name__)


def as_int(x):
    """An integer argument of the Python interface as a Python int, as the ops' schemas
    take them: ``operator.index`` (numpy integers, 0-d integer tensors), never a bool.
    Anything else passes unchanged, for the caller's check to refuse with its name."""
    if isinstance(x, bool) or isinstance(x, torch.SymInt):
        return x
    try:
        return operator.index(x)
    except TypeError:
        return x


def check_options(chunk_size, ints, flags, snapshot_quant) -> list:
    """The options of a Python-interface call, checked before anything else, where the
    ops' schemas would take what the interface refuses: ``chunk_size`` and each
    ``(name, value)`` of ``ints`` an int as ``as_int`` takes it (never a bool), each of
    ``flags`` a bool (a schema takes 0, 1 or None for one), ``snapshot_quant`` one of the
    modes. Returns ``[chunk_size, *ints]`` as Python ints."""
    out = []
    for name, x in (("chunk_size", chunk_size), *ints):
        x = as_int(x)
        if isinstance(x, bool) or not isinstance(x, (int, torch.SymInt)) \
                or isinstance(x, int) and not -2**63 <= x < 2**63:
            _fail(name, "a 64-bit int", repr(x))
        out.append(x)
    check_chunk_size(out[0])
    for name, x in flags:
        if not isinstance(x, (bool, torch.SymBool)):
            _fail(name, "True or False", repr(x))
    check_snapshot_quant(snapshot_quant)
    return out


def check_chunk_size(chunk_size) -> None:
    chunk_size = static_int(chunk_size)
    if not isinstance(chunk_size, int) or not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        _fail("chunk_size", f"an int in {MIN_CHUNK}..{MAX_CHUNK}", chunk_size)


def check_snapshot_quant(snapshot_quant) -> None:
    if not isinstance(snapshot_quant, str) or snapshot_quant not in quant.MODES:
        _fail("snapshot_quant", f"one of {quant.MODES}", repr(snapshot_quant))


def static_int(x):
    """An int option as a Python int. ``torch.compile(dynamic=True)`` makes int arguments
    and closure variables symbolic; the chunk size and the slots per stream shape the
    kernels, so a symbolic one is specialized here (``int()`` of a ``SymInt`` guards the
    compiled graph on its value: another value recompiles). Non-ints pass unchanged."""
    return int(x) if isinstance(x, torch.SymInt) else x


def check_call(bank: Tensor, k_idx: Tensor, k_val: Tensor, v: Tensor, beta: Tensor | None,
               g: Tensor | None, q_idx: Tensor, q_val: Tensor, chunk_size: int,
               slots_per_stream: int, shared_bank: bool, snapshot_quant: str,
               names: Names = OP_NAMES, in_place: bool = False, gated: bool = False) -> None:
    """Shape, dtype, device and option checks (no data read: safe on fake tensors), no
    forward-mode tangents (``refuse_forward_ad``) and, for a call that writes the bank in
    place (``in_place``), no input sharing its memory (``check_apart``).

    ``gated``: the call has raw gates in place of ``beta`` / ``g`` (passed as None), which
    its caller checks itself (``check_gated``); otherwise a None gate is refused like any
    other non-tensor (a schema's ``Tensor`` argument takes None from Python).
    ``names``: how the caller spells the bank, the slots per stream and the stream count."""
    gates = [] if gated else [("beta", beta), ("g", g)]
    bank_name = names.bank
    floats = (("k_val", k_val), ("v", v), *gates, ("q_val", q_val))
    named = (("k_idx", k_idx), ("k_val", k_val), ("v", v), *gates, ("q_idx", q_idx),
             ("q_val", q_val))
    check_tensors(named)
    chunk_size, slots_per_stream = static_int(chunk_size), static_int(slots_per_stream)
    if not isinstance(bank, Tensor) or bank.dim() != 2:
        _fail(bank_name, "a 2-D bank [S, hd]",
              _shape(bank) if isinstance(bank, Tensor) else type(bank))
    if bank.dtype not in BANK_DTYPES:
        _fail(bank_name, "dtype float32 or bfloat16", bank.dtype)
    S, hd = bank.shape
    if k_idx.dim() != 3:
        _fail("k_idx", "shape [P, T, W]", _shape(k_idx))
    P, T, W = k_idx.shape
    for name, t in (("k_idx", k_idx), ("q_idx", q_idx)):
        if t.dtype not in INDEX_DTYPES:
            _fail(name, "dtype int32 or int64", t.dtype)
    for name, t in floats:
        if not t.is_floating_point():
            _fail(name, "a floating-point tensor", t.dtype)
    for name, t in named:
        if t.device != bank.device:
            _fail(name, f"device {bank.device} (the {bank_name}'s)", t.device)
    if not 1 <= W <= MAX_SLOTS_PER_TOKEN:
        _fail("k_idx", f"1..{MAX_SLOTS_PER_TOKEN} write slots per token (last dim)", W)
    if _shape(k_val) != [P, T, W]:
        _fail("k_val", f"shape [P, T, W] = {[P, T, W]} like k_idx", _shape(k_val))
    if _shape(v) != [P, T, hd]:
        _fail("v", f"shape [P, T, hd] = {[P, T, hd]} (hd from the {bank_name})", _shape(v))
    if not gated and _shape(beta) != [P, T]:
        _fail("beta", f"shape [P, T] = {[P, T]}", _shape(beta))
    if not gated and (g.dim() != 3 or _shape(g)[:2] != [P, T] or g.shape[2] not in (1, W)):
        _fail("g", f"shape [P, T, 1] or [P, T, W] = {[P, T, W]}", _shape(g))
    if q_idx.dim() != 3 or _shape(q_idx)[:2] != [P, T]:
        _fail("q_idx", f"shape [P, T, R] with P, T = {P}, {T}", _shape(q_idx))
    R = q_idx.shape[2]
    if not 1 <= R <= MAX_SLOTS_PER_TOKEN:
        _fail("q_idx", f"1..{MAX_SLOTS_PER_TOKEN} read slots per token (last dim)", R)
    if _shape(q_val) != [P, T, R]:
        _fail("q_val", f"shape [P, T, R] = {[P, T, R]} like q_idx", _shape(q_val))
    check_chunk_size(chunk_size)
    check_snapshot_quant(snapshot_quant)
    check_layout(S, P, slots_per_stream, shared_bank, names)
    refuse_forward_ad(((bank_name, bank), *floats))
    if in_place:
        check_distinct_elements(bank, bank_name)
        check_apart(bank, named, bank_name)


def check_distinct_elements(bank: Tensor, bank_name: str = "bank") -> None:
    """A bank written in place needs each element at a memory location of its own: refuse
    one whose elements share memory (``expand``, a zero stride), as torch's in-place ops
    do."""
    if _has_memory(bank) and torch._debug_has_internal_overlap(bank) == 1:   # MemOverlap::Yes
        _fail(bank_name, "a tensor whose elements each have memory of their own (it is "
              "written in place; pass a clone)",
              f"elements sharing memory (strides {list(bank.stride())})")


def _has_memory(t: Tensor) -> bool:
    """Whether ``t`` has memory to check: not while tracing (fake and meta tensors; a traced
    call's op checks its real tensors when run)."""
    return not (torch.compiler.is_compiling() or t.device.type == "meta" or is_fake(t))


def _byte_span(t: Tensor) -> tuple[int, int]:
    """``[first, last)`` bytes of ``t``'s elements in its storage (empty: ``(0, 0)``)."""
    if t.numel() == 0:
        return 0, 0
    first = t.data_ptr() + sum(st * (n - 1) for n, st in zip(t.shape, t.stride()) if st < 0)
    extent = sum(abs(st) * (n - 1) for n, st in zip(t.shape, t.stride())) + 1
    return first, first + extent * t.element_size()


def check_apart(bank: Tensor, named, bank_name: str = "bank") -> None:
    """An op that writes ``bank`` in place reads each ``(name, tensor)`` of ``named`` as the
    tokens come, not as it was at the call: refuse one whose memory the bank's bytes
    overlap (real tensors only). Views of one buffer that only interleave are refused
    too, like an overlap (their byte spans cross); a clone of either is always accepted."""
    if not _has_memory(bank):
        return
    st = bank.untyped_storage()
    s0, s1 = st.data_ptr(), st.data_ptr() + st.nbytes()
    lo, hi = None, None
    for name, t in named:
        ts = t.untyped_storage()
        if ts.data_ptr() >= s1 or ts.data_ptr() + ts.nbytes() <= s0:
            continue   # the storages do not meet (the common case): apart
        if lo is None:
            lo, hi = _byte_span(bank)
        a, b = _byte_span(t)
        if a < hi and lo < b:
            _fail(name, f"memory apart from the {bank_name} that the call writes in place "
                  "(pass a clone)", f"a tensor overlapping the {bank_name}'s memory")


def refuse_forward_ad(named) -> None:
    """Forward-mode AD (``torch.func.jvp`` / ``jacfwd``, ``torch.autograd.forward_ad``) has
    no rule in the sdm ops, and torch would give their outputs zero tangents without a
    word: refuse an input that carries a tangent. Free when no dual level is active."""
    if forward_ad._current_level < 0 or torch.compiler.is_compiling():
        return
    for name, t in named:
        if isinstance(t, Tensor) and _tangent(t) is not None:
            raise NotImplementedError(
                f"sdm: argument '{name}' carries a forward-mode tangent: forward-mode AD "
                "(torch.func.jvp, jacfwd, torch.autograd.forward_ad) is not implemented for "
                "the sdm ops; use reverse mode (torch.autograd.grad or .backward())")


def _tangent(t: Tensor):
    """``t``'s forward-mode tangent at the current level. Inside an in-place custom op's
    body torch 2.11 excludes the ADInplaceOrView key, and ``unpack_dual``'s view of the
    primal then fails an internal assert; the view is made with the key included."""
    with torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False):
        return forward_ad.unpack_dual(t).tangent


def no_work(bank: Tensor, k_idx: Tensor) -> bool:
    """A call with no streams, no tokens or zero-width rows moves nothing: its readings are
    empty, its final bank is its bank, its gradients are zero (the upstream bank gradient
    passes through). Every implementation takes this path before Phase 1."""
    return k_idx.numel() == 0 or bank.shape[1] == 0


def check_backward(grad_readings: Tensor, grad_final: Tensor, final_bank: Tensor,
                   saved_rows: Tensor, saved_scales: Tensor, k_idx: Tensor, k_val: Tensor,
                   v: Tensor, beta: Tensor, g: Tensor, q_idx: Tensor, q_val: Tensor,
                   chunk_size: int, snapshot_quant: str, saved_shapes) -> None:
    """``sdm::write_read_backward``'s arguments (shapes only): the forward's inputs as
    ``check_call`` checks them (``grad_final`` in the bank's place), the upstream
    gradients, and what the forward saved: its final bank and its undo log, whose shapes
    ``saved_shapes(snapshot_quant)`` gives as ``(rows, dtype, scales)``."""
    check_call(grad_final, k_idx, k_val, v, beta, g, q_idx, q_val, chunk_size, 0, True,
               snapshot_quant, names=Names(bank="grad_final"))
    P, T, _ = k_idx.shape
    S, hd = grad_final.shape
    for name, t in (("grad_readings", grad_readings), ("final_bank", final_bank),
                    ("saved_rows", saved_rows), ("saved_scales", saved_scales)):
        if not isinstance(t, Tensor):
            _fail(name, "a tensor", type(t))
        if t.device != grad_final.device:
            _fail(name, f"device {grad_final.device} (grad_final's)", t.device)
    if _shape(grad_readings) != [P, T, hd] or not grad_readings.is_floating_point():
        _fail("grad_readings", f"a float tensor of the readings' shape [P, T, hd] = {[P, T, hd]}",
              f"{grad_readings.dtype} {_shape(grad_readings)}")
    if _shape(final_bank) != [S, hd] or final_bank.dtype != grad_final.dtype:
        _fail("final_bank", f"the forward's final bank: {grad_final.dtype} {[S, hd]} like "
              "grad_final", f"{final_bank.dtype} {_shape(final_bank)}")
    rows, dtype, scales = saved_shapes(snapshot_quant)
    if _shape(saved_rows) != list(rows) or saved_rows.dtype != dtype:
        _fail("saved_rows", f"the undo log of a saving forward with chunk_size={chunk_size}, "
              f"snapshot_quant={snapshot_quant!r}: {dtype} {list(rows)}",
              f"{saved_rows.dtype} {_shape(saved_rows)}")
    if _shape(saved_scales) != list(scales) or saved_scales.dtype != torch.float32:
        _fail("saved_scales", f"float32 {list(scales)} (snapshot_quant={snapshot_quant!r})",
              f"{saved_scales.dtype} {_shape(saved_scales)}")


def check_gated(bank: Tensor, k_idx: Tensor, b_raw: Tensor, a_raw: Tensor, A_log: Tensor,
                dt_bias: Tensor) -> None:
    """The gate inputs of ``sdm::write_read_gated`` (after ``check_call`` without gates):
    ``b_raw`` / ``a_raw`` one value per token, ``[P, T]`` or ``[B, T, H]`` with
    ``B * H = P`` (a projection's output), the same shape both; ``A_log`` / ``dt_bias``
    one value per stream ``[P]``."""
    P, T, _ = k_idx.shape
    raw = (("b_raw", b_raw), ("a_raw", a_raw), ("A_log", A_log), ("dt_bias", dt_bias))
    for name, t in raw:
        if not isinstance(t, Tensor):
            _fail(name, "a tensor", type(t))
        if not t.is_floating_point():
            _fail(name, "a floating-point tensor", t.dtype)
        if t.device != bank.device:
            _fail(name, f"device {bank.device} (the bank's)", t.device)
    ok = (b_raw.dim() == 2 and _shape(b_raw) == [P, T]) or (
        b_raw.dim() == 3 and b_raw.shape[1] == T and b_raw.shape[0] * b_raw.shape[2] == P)
    if not ok:
        _fail("b_raw", f"one value per token: [P, T] = {[P, T]} or [B, T, H] with B * H = {P} "
              f"and T = {T}", _shape(b_raw))
    if _shape(a_raw) != _shape(b_raw):
        _fail("a_raw", f"the shape of b_raw {_shape(b_raw)}", _shape(a_raw))
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if _shape(t) != [P]:
            _fail(name, f"one value per stream: shape [P] = {[P]}", _shape(t))
    refuse_forward_ad(raw)


def check_layout(S, P, slots_per_stream: int, shared_bank: bool,
                 names: Names = OP_NAMES) -> None:
    sph_name = names.slots_per_stream
    if not isinstance(slots_per_stream, int) or slots_per_stream < 0:
        _fail(sph_name, "0 (one shared bank) or the slots per stream (> 0)", slots_per_stream)
    if slots_per_stream in (0, S):
        if P > 1 and not shared_bank:
            _fail("shared_bank", f"True to run {P} streams on one shared bank of {S} rows "
                  f"(it asserts the streams select disjoint slots), or {sph_name} = {names.bank} "
                  "rows / streams", False)
        return
    if S % slots_per_stream:
        _fail(sph_name, f"a divisor of the {names.bank}'s {S} rows", slots_per_stream)
    if S // slots_per_stream != P and P > 0:   # no streams: nothing to place (``no_work``)
        if names.streams is not None:
            _fail(names.streams, f"{S // slots_per_stream} streams ({names.bank} rows {S} / "
                  f"{sph_name} {slots_per_stream})", P)
        _fail(sph_name, f"{S // P if S % P == 0 else 'a divisor'} for {P} streams (k_idx.shape[0]) "
              f"on the {names.bank}'s {S} rows ({names.bank} rows / streams)", slots_per_stream)


# host-side index checks look at this many tokens at a time, so their temporaries
# (a few [P, window, W] tensors) do not grow with T
CHECK_WINDOW_TOKENS = 4096


def token_windows(idx: Tensor):
    """``idx[..., t0:t1, :]`` over windows of CHECK_WINDOW_TOKENS tokens (dim -2), with t0."""
    T = idx.shape[-2]
    for t0 in range(0, T, CHECK_WINDOW_TOKENS):
        yield t0, idx[..., t0:t0 + CHECK_WINDOW_TOKENS, :]


def _first_bad(bad: Tensor, t0: int):
    p, t, w = (int(x) for x in bad.nonzero()[0])
    return p, t0 + t, w


def _out_of_range(idx: Tensor, P: int, S: int, slots_per_stream: int, own: bool) -> Tensor:
    """Where ``idx`` ([P, t, n]) leaves its stream's rows (``own``) or the bank."""
    if own:
        lo = torch.arange(P, device=idx.device).view(P, 1, 1) * slots_per_stream
        return (idx < lo) | (idx >= lo + slots_per_stream)
    return (idx < 0) | (idx >= S)


def start_index_check(S: int, P: int, slots_per_stream: int, k_idx: Tensor,
                      q_idx: Tensor, range_flags=None) -> "IndexCheck":
    """Index ranges (reads data: real tensors only): own ranges per stream, or disjoint
    written slots across the streams of a shared bank. Returns the check in flight: its
    verdict is a device tensor of flags, read by ``IndexCheck.wait``.

    Each stream's smallest and largest index decide (``aminmax``: no temporaries), or the
    device implementation's one-launch check (``range_flags(k_idx, q_idx, rows,
    rows_per_stream, own)``, ``kernels.index_ranges``) where it has one. On CUDA the flags
    are copied to pinned host memory behind an event, so the host can queue work that
    writes nothing (Phase 1) and wait only before the first write: a host sync here would
    stop the host from queueing ahead and expose the launch latency of every kernel behind
    it. Only a failing call searches for the first bad index, to name it."""
    own = slots_per_stream not in (0, S)
    if not (k_idx.numel() or q_idx.numel()):
        return IndexCheck(None, ())
    disjoint = not own and P > 1 and k_idx.numel() > 0
    if range_flags is not None:
        found = range_flags(k_idx, q_idx, S, slots_per_stream, own)
    else:
        found = _range_flag(S, P, slots_per_stream, k_idx, q_idx, own)
    if disjoint:
        found = found.any() | _shared_conflicts(S, P, k_idx, q_idx)
    return IndexCheck(found, (S, P, slots_per_stream, k_idx, q_idx, own, disjoint))


def _range_flag(S, P, slots_per_stream, k_idx, q_idx, own) -> Tensor:
    """A device flag: an index of ``k_idx`` / ``q_idx`` (not both empty) leaves its range."""
    if own:
        lo = torch.arange(P, device=k_idx.device) * slots_per_stream
        hi = lo + slots_per_stream
    else:
        lo, hi = 0, S
    found = None
    for idx in (k_idx, q_idx):
        if idx.numel():
            mn, mx = torch.aminmax(idx.reshape(P, -1), dim=1)
            bad = ((mn < lo) | (mx >= hi)).any()
            found = bad if found is None else found | bad
    return found


class IndexCheck:
    """A started index check (``start_index_check``); ``wait`` raises if it failed."""

    def __init__(self, flag: Tensor | None, args: tuple):
        """``flag``: nonzero anywhere if the check failed (a device tensor), or None."""
        self._flag, self._args, self._event = flag, args, None
        if flag is not None and flag.is_cuda:
            self._flag = torch.empty(flag.shape, dtype=flag.dtype, pin_memory=True)
            self._flag.copy_(flag, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def wait(self) -> None:
        """Block until the verdict is known; raise ``SDMArgumentError`` naming the first
        bad index if there is one. Later calls return at once."""
        flag, self._flag = self._flag, None
        if flag is None:
            return
        if self._event is not None:
            self._event.synchronize()
        if bool(flag.any()):
            _name_bad_index(*self._args)


class DeferredIndexCheck:
    """An index check (``start``: a ``start_index_check`` call) that an implementation
    starts beside work that writes nothing (Phase 1), before or after queuing that work as
    its host time suits. Started so (``beside``) on CUDA, it runs on a stream of its own
    that waits only for what was queued before this was made (the inputs), so its verdict
    does not wait for that work on the GPU; its tensors are in use there only until
    ``wait`` returns, which every call does before it returns. Not started before ``wait``
    (a path with no such work), it runs there, on the current stream."""

    def __init__(self, start, device: torch.device):
        self._start, self._check, self._ready = start, None, None
        if device.type == "cuda":
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(device))
            self._device = device

    def start(self, beside: bool = True) -> IndexCheck:
        if self._check is None:
            if self._ready is None or not beside:
                self._check = self._start()
            else:
                side = _check_stream(self._device)
                side.wait_event(self._ready)
                with torch.cuda.stream(side):   # the verdict's copy and event on it too
                    self._check = self._start()
        return self._check

    def wait(self) -> None:
        self.start(beside=False).wait()


_CHECK_STREAMS: dict = {}


def _check_stream(device: torch.device) -> "torch.cuda.Stream":
    """The index checks' stream on ``device``."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _CHECK_STREAMS:
        _CHECK_STREAMS[idx] = torch.cuda.Stream(idx)
    return _CHECK_STREAMS[idx]


def _name_bad_index(S, P, slots_per_stream, k_idx, q_idx, own, disjoint):
    for name, idx in (("k_idx", k_idx), ("q_idx", q_idx)):
        for t0, win in token_windows(idx):
            bad = _out_of_range(win, P, S, slots_per_stream, own)
            if bool(bad.any()):
                p, t, w = _first_bad(bad, t0)
                want = (f"rows of stream {p} in [{p * slots_per_stream}, "
                        f"{(p + 1) * slots_per_stream})" if own else f"bank rows in [0, {S})")
                _fail(name, want, f"{int(idx[p, t, w])} at [{p}, {t}, {w}] (stream, token, entry)")
    if disjoint:
        _check_disjoint(S, P, k_idx, q_idx)
    raise AssertionError("sdm: the index check flagged a call but found no bad index")


def _row_owners(S, P, k_idx):
    """The stream that writes each bank row (-1: none), and the stream ids ``[P, 1, 1]``.
    Out-of-range indices land in an extra row ``S`` (the range check names them), so this
    runs before the range check's verdict is known."""
    owner = torch.full((S + 1,), -1, dtype=torch.long, device=k_idx.device)
    sid = torch.arange(P, device=k_idx.device).view(P, 1, 1)
    for _, win in token_windows(k_idx):
        owner.scatter_(0, _in_bank(win, S).reshape(-1), sid.expand_as(win).reshape(-1))
    return owner, sid


def _in_bank(win: Tensor, S: int) -> Tensor:
    """``win`` as int64 rows, out-of-range entries sent to row ``S``."""
    win = win.long()
    return torch.where((win >= 0) & (win < S), win, S)


def _conflicts(owner, sid, win, S) -> Tensor:
    """Where a row of ``win`` is written by another stream than the one touching it."""
    o = owner[_in_bank(win, S)]
    return (o >= 0) & (o != sid)


def _shared_conflicts(S, P, k_idx, q_idx) -> Tensor:
    """A device flag: a row written by one stream of a shared bank is touched by another."""
    owner, sid = _row_owners(S, P, k_idx)
    found = torch.zeros((), dtype=torch.bool, device=k_idx.device)
    for idx in (k_idx, q_idx):
        for _, win in token_windows(idx):
            found |= _conflicts(owner, sid, win, S).any()
    return found


def _check_disjoint(S, P, k_idx, q_idx):
    """shared_bank=True asserts disjoint streams: a row written by one stream is touched by
    no other. Names the first such index."""
    owner, sid = _row_owners(S, P, k_idx)
    for name, idx in (("k_idx", k_idx), ("q_idx", q_idx)):
        for t0, win in token_windows(idx):
            bad = _conflicts(owner, sid, win, S)
            if bool(bad.any()):
                p, t, w = _first_bad(bad, t0)
                o = int(owner[int(idx[p, t, w])])
                _fail(name, "streams on a shared bank to select disjoint slots (shared_bank=True)",
                      f"row {int(idx[p, t, w])} of stream {p} at [{p}, {t}, {w}] also written by "
                      f"stream {o} (positions as [stream, token, entry])")
