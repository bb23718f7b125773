"""FP4 weights decoded inside a Triton kernel's tile, element by element: e2m1 codes (two a byte, low nibble first)
and their e4m3 block scales (NVFP4, 16 along K), read as bytes. Every value is exact in fp32, and the product of a
code and its block scale (at most 6 significant bits, within [2**-10, 2688]) is exact in bf16 and fp16 too."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_values(codes):
    """int32 codes 0..15 -> fp32 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives (bit 3 is the sign)."""
    m = codes & 7
    e = m >> 1
    half = (m & 1).to(tl.float32) * 0.5
    pow2 = ((e + 126) << 23).to(tl.float32, bitcast=True)  # 2 ** (e - 1)
    mag = tl.where(e == 0, half, pow2 * (1.0 + half))
    return tl.where((codes & 8) != 0, -mag, mag)


@triton.jit
def e4m3_values(b):
    """int32 bytes of non-negative float8_e4m3fn scales -> fp32 (normal: exponent and mantissa moved into an fp32's
    bits; subnormal: mantissa * 2**-9)."""
    ex = (b >> 3) & 15
    mant = b & 7
    normal = (((ex + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    return tl.where(ex == 0, mant.to(tl.float32) * 0.001953125, normal)


@triton.jit
def nvfp4_values(rows_ptr, scale_rows_ptr, mask, k, stride_sk):
    """fp32 ``e2m1 * block_scale`` at columns ``k`` of the NVFP4 rows whose codes start at byte pointers ``rows_ptr``
    and whose e4m3 block scales (as bytes, ``stride_sk`` apart) start at ``scale_rows_ptr``; masked-off elements are
    0. The global scale is the caller's (applied once to the sums)."""
    byte = tl.load(rows_ptr + k // 2, mask=mask, other=0).to(tl.int32)
    sb = tl.load(scale_rows_ptr + (k // 16) * stride_sk, mask=mask, other=0).to(tl.int32)
    return e2m1_values((byte >> (4 * (k % 2))) & 15) * e4m3_values(sb)
