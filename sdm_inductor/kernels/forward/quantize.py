"""The undo log's scaled modes (``quant.py``: fp8 e4m3 / int4 with one fp32 scale per row)
packed by one kernel from the raw rows the write launches stored.

The write launches' programs each see a block of columns, not whole rows, so a scaled
mode's log is first stored raw (the bank's dtype) and packed afterwards; torch ops did
that in fp32 temporaries, ~9 ms per training forward at config A. Here one program packs
``RB`` whole rows: absmax, scale, and the bytes, with the same rounding as
``quant.quantize`` (round to nearest even; the fp8 bytes are encoded by hand, as
``tiles._fp8_e4m3_to_f32`` decodes them, so no fp8 type is needed, e.g. in the
interpreter).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ... import quant
from ..common.tiles import row_length
from ..runtime.launch import launch, multiple_of_16, pow2

_MODE = {"fp8": 1, "int4": 2}
# measured on the H200 at config A's log (docs/performance.md, measurement facts): 2 rows x 2 warps
ROWS_PER_PROGRAM = 2
WARPS = 2


@triton.jit
def _rint(x):
    """Round to nearest, ties to even (as torch.round), for |x| < 2**22."""
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    return tl.where(tie & ((r - 2.0 * tl.floor(r * 0.5)) != 0.0), r - 1.0, r)


@triton.jit
def _f32_to_e4m3(y):
    """fp32 (|y| <= 448) -> float8 e4m3fn bits, rounded to nearest even."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    a = tl.abs(y)
    e = ((bits >> 23) & 0xFF) - 127               # exponent of a (a normal fp32)
    normal = a >= 0.015625                         # 2**-6, e4m3's smallest normal
    # quantum of the format at a: 2**(e - 3) for normals, 2**-9 below
    q_exp = tl.where(normal, e - 3, -9)
    inv_q = ((127 - q_exp) << 23).to(tl.float32, bitcast=True)   # 2**-q_exp, exactly
    m = _rint(a * inv_q)
    # normals: m in [8, 16] (16 carries into the exponent); subnormals: m in [0, 8]
    code = tl.where(normal, (e + 7) * 8 + m.to(tl.int32) - 8, m.to(tl.int32))
    return (code | (sign << 7)).to(tl.uint8)


@triton.jit
def _quantize_kernel(raw_ptr, out_ptr, scale_ptr, n_rows, hd, width, MODE: tl.constexpr,
                     RB: tl.constexpr, HP: tl.constexpr, HD16: tl.constexpr,
                     WIDTH16: tl.constexpr):
    # HP: pow2 >= the row's pairs (int4) or columns / 2 (fp8): columns 2j and 2j + 1 are
    # loaded as two halves so int4 packs them into byte j
    hd = row_length(hd, HD16)
    width = row_length(width, WIDTH16)
    rows = tl.program_id(0) * RB + tl.arange(0, RB)
    rm = rows < n_rows
    j = tl.arange(0, HP)
    ce, co = 2 * j, 2 * j + 1
    base = raw_ptr + rows.to(tl.int64)[:, None] * hd
    me = rm[:, None] & (ce < hd)[None, :]
    mo = rm[:, None] & (co < hd)[None, :]
    xe = tl.load(base + ce[None, :], mask=me, other=0.0).to(tl.float32)
    xo = tl.load(base + co[None, :], mask=mo, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(xe), axis=1), tl.max(tl.abs(xo), axis=1))
    if MODE == 1:
        top = 448.0
    else:
        top = 7.0
    scale = tl.where(amax > 0, amax / top, 1.0)
    ye = xe / scale[:, None]
    yo = xo / scale[:, None]
    obase = out_ptr + rows.to(tl.int64)[:, None] * width
    if MODE == 1:
        tl.store(obase + ce[None, :], _f32_to_e4m3(ye), mask=me)
        tl.store(obase + co[None, :], _f32_to_e4m3(yo), mask=mo)
    else:
        ne = tl.minimum(tl.maximum(_rint(ye), -8.0), 7.0).to(tl.int32) + 8
        no = tl.minimum(tl.maximum(_rint(yo), -8.0), 7.0).to(tl.int32) + 8
        no = tl.where(mo, no, 8)                   # an odd row's pad column packs as 0
        tl.store(obase + j[None, :], (ne | (no << 4)).to(tl.uint8), mask=me)
    tl.store(scale_ptr + rows, scale, mask=rm)


def pack_log(raw: Tensor, mode: str, bank_dtype: torch.dtype):
    """``quant.quantize`` of the raw log ``[n, W, hd]`` for a scaled mode, as one launch:
    (rows ``[n, W, width]`` uint8, scales ``[n, W]`` fp32)."""
    n, W, hd = raw.shape
    dtype, width, scaled = quant.storage(mode, bank_dtype, hd)
    assert scaled, mode
    rows = raw.new_empty(n, W, width, dtype=dtype)
    scales = raw.new_empty(n, W, dtype=torch.float32)
    RB = ROWS_PER_PROGRAM
    launch(_quantize_kernel, (triton.cdiv(n * W, RB),), raw, rows, scales, n * W, hd, width,
           MODE=_MODE[mode], RB=RB, HP=pow2(-(-hd // 2)), HD16=multiple_of_16(hd),
           WIDTH16=multiple_of_16(width), num_warps=WARPS)
    return rows, scales
