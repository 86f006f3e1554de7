"""Storage of what the backward keeps of the written rows (``snapshot_quant``).

"none": the bank's dtype. "bf16": bfloat16. "fp8": float8 e4m3 with one fp32 scale
per row, kept as its bytes (uint8) so that the op's outputs support ordinary tensor ops. "int4": two signed 4-bit values per byte with one fp32 scale per row.
Rows are quantized one at a time (the last dim), so any layout ``[..., hd]`` works.
"""
from __future__ import annotations

import torch
from torch import Tensor

MODES = ("none", "bf16", "fp8", "int4")
_FP8_MAX = 448.0
_INT4_MAX = 7.0


def storage(mode: str, bank_dtype: torch.dtype, hd: int):
    """(row dtype, stored width, has scales) of a mode."""
    if mode == "none" or (mode == "bf16" and bank_dtype == torch.bfloat16):
        return bank_dtype, hd, False
    if mode == "bf16":
        return torch.bfloat16, hd, False
    if mode == "fp8":
        return torch.uint8, hd, True
    if mode == "int4":
        return torch.uint8, (hd + 1) // 2, True
    raise ValueError(f"snapshot_quant: expected one of {MODES}, got {mode!r}")


def quantize(rows: Tensor, mode: str, bank_dtype: torch.dtype):
    """rows [..., hd] -> (stored [..., width], scales [...] or None)."""
    dtype, _, scaled = storage(mode, bank_dtype, rows.shape[-1])
    if not scaled:
        return rows.to(dtype), None
    x = rows.float()
    amax = x.abs().amax(-1)
    top = _FP8_MAX if mode == "fp8" else _INT4_MAX
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    y = x / scale[..., None]
    if mode == "fp8":
        return y.to(torch.float8_e4m3fn).view(torch.uint8), scale
    n = torch.round(y).clamp_(-8, 7).to(torch.int16) + 8   # 0..15
    if n.shape[-1] % 2:
        n = torch.nn.functional.pad(n, (0, 1), value=8)
    packed = n[..., 0::2] | (n[..., 1::2] << 4)
    return packed.to(torch.uint8), scale


def dequantize(stored: Tensor, scales: Tensor | None, mode: str, hd: int) -> Tensor:
    """Inverse of ``quantize``, as fp32 [..., hd]."""
    if mode in ("none", "bf16"):
        return stored.float()
    if mode == "fp8":
        return stored.view(torch.float8_e4m3fn).float() * scales[..., None]
    b = stored.to(torch.int16)
    n = torch.stack([b & 0xF, b >> 4], -1).flatten(-2)[..., :hd]
    return (n - 8).float() * scales[..., None]


class UndoLog:
    """What the backward keeps of a call: the chunk-start value of each row a chunk
    writes (its *undo log*), stored per ``mode``. Layout ``[n_seg * C, W, width]``, i.e.
    ``C * W`` rows per segment (segment = chunk * P + stream, chunk-major): the row of
    slot ``s`` written in segment ``b`` is ``b * C * W + j``, ``j`` the number of the
    segment's write entries with a smaller slot (counting each slot once per token),
    i.e. the start of the slot's run in the slot-sorted write order; other rows are
    unspecified and never read. With the final bank this restores every chunk's start
    state in reverse."""

    def __init__(self, n: int, W: int, hd: int, bank_dtype, mode: str, device, enabled: bool):
        dtype, width, scaled = storage(mode, bank_dtype, hd)
        self.mode, self.hd, self.bank_dtype = mode, hd, bank_dtype
        shape = (n if enabled else 0, W, width)
        self.rows = torch.zeros(shape, dtype=dtype, device=device)
        self.scales = torch.ones(shape[:2] if (scaled and enabled) else (0,),
                                 dtype=torch.float32, device=device)

    @classmethod
    def from_tensors(cls, rows: Tensor, scales: Tensor, hd: int, mode: str):
        self = cls.__new__(cls)
        self.rows, self.scales, self.mode, self.hd = rows, scales, mode, hd
        return self

    def put(self, pos: Tensor, rows: Tensor):
        """Store ``rows [n, hd]`` at flat log positions ``pos [n]`` (of an enabled log)."""
        q, s = quantize(rows, self.mode, self.bank_dtype)
        self.rows.view(-1, self.rows.shape[-1]).index_copy_(0, pos, q)
        if s is not None:
            self.scales.view(-1).index_copy_(0, pos, s)

    def get(self, pos: Tensor) -> Tensor:
        """The rows at flat positions ``pos``, dequantized (fp32)."""
        s = self.scales.view(-1).index_select(0, pos) if self.scales.numel() else None
        return dequantize(self.rows.view(-1, self.rows.shape[-1]).index_select(0, pos), s,
                          self.mode, self.hd)

    def tensors(self):
        return self.rows, self.scales
