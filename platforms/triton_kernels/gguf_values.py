"""GGUF weights decoded inside a Triton kernel's tile: the value of any element of a raw GGUF row, by byte loads at
offsets computed from its column (rows are only 2-byte aligned, so no wide loads; see gguf_linear.py).

The formulas are the reference's (engine/core/ops/gguf_quant.py, gguf_kquants.py), in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def f16_at(p, mask):
    """fp32 value of the little-endian fp16 at byte pointers ``p`` (any alignment)."""
    lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def kquant_values(rows_ptr, mask, sb, e, QTYPE: tl.constexpr, BYTES: tl.constexpr):
    """fp32 values at index ``e`` (0..255, any shape broadcasting with ``rows_ptr``) of super-block ``sb`` (a scalar)
    of the K-quant (Q4_K 12, Q5_K 13, Q6_K 14; BYTES per super-block) rows starting at byte pointers ``rows_ptr``."""
    base = rows_ptr + sb * BYTES
    if QTYPE == 14:  # Q6_K
        h = e // 128
        s = (e % 128) // 32
        i = e % 32
        ql = tl.load(base + 64 * h + 32 * (s % 2) + i, mask=mask, other=0).to(tl.int32)
        qh = tl.load(base + 128 + 32 * h + i, mask=mask, other=0).to(tl.int32)
        q = ((ql >> (4 * (s // 2))) & 15) | (((qh >> (2 * s)) & 3) << 4)
        sc = tl.load(base + 192 + e // 16, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        d = f16_at(base + 208, mask)
        return (d * sc) * (q - 32).to(tl.float32)
    else:  # Q4_K, Q5_K
        j = e // 32
        i = e % 32
        QS: tl.constexpr = 48 if QTYPE == 13 else 16
        q = (tl.load(base + QS + 32 * (e // 64) + i, mask=mask, other=0).to(tl.int32) >> (4 * (j % 2))) & 15
        if QTYPE == 13:
            q = q | (((tl.load(base + 16 + i, mask=mask, other=0).to(tl.int32) >> j) & 1) << 4)
        lo = j < 4
        b_j = tl.load(base + 4 + tl.where(lo, j, j + 4), mask=mask, other=0).to(tl.int32)
        b_m = tl.load(base + 4 + tl.where(lo, j + 4, j - 4), mask=mask, other=0).to(tl.int32)
        b_x = tl.load(base + 4 + j, mask=mask, other=0).to(tl.int32)
        sc = tl.where(lo, b_j & 63, (b_j & 15) | ((b_m >> 6) << 4)).to(tl.float32)
        mn = tl.where(lo, b_m & 63, (b_j >> 4) | ((b_x >> 6) << 4)).to(tl.float32)
        d = f16_at(base, mask)
        dmin = f16_at(base + 2, mask)
        return (d * sc) * q.to(tl.float32) - dmin * mn


@triton.jit
def gguf_values(rows_ptr, mask, k, k0, QTYPE: tl.constexpr, BYTES: tl.constexpr):
    """fp32 values at columns ``k`` of the GGUF rows starting at byte pointers ``rows_ptr`` (broadcasting shapes;
    masked-off elements are 0). ``k0`` (a scalar) is the first column of the tile, which for a K-quant must lie in the
    super-block of every ``k`` (a tile of at most 256 columns starting at a multiple of its width). BYTES: bytes per
    block (Q4_0 18, Q4_1 20, Q8_0 34) or super-block (K-quants)."""
    if QTYPE >= 12:
        return kquant_values(rows_ptr, mask, k0 // 256, k % 256, QTYPE, BYTES)
    else:
        base = rows_ptr + (k // 32) * BYTES
        w = k % 32
        d = f16_at(base, mask)
        if QTYPE == 8:  # Q8_0
            return tl.load(base + 2 + w, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32) * d
        else:
            q = ((tl.load(base + (BYTES - 16) + w % 16, mask=mask, other=0).to(tl.int32) >> (4 * (w // 16)))
                 & 15).to(tl.float32)
            if QTYPE == 2:  # Q4_0
                return (q - 8.0) * d
            else:  # Q4_1
                return q * d + f16_at(base + 2, mask)
