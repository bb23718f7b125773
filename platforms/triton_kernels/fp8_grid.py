"""Rounding to the e4m3 grid in fp32 arithmetic, shared by the FP8 quantization kernels.

A kernel that rounds with :func:`round_to_fp8_grid` before its final cast only asks the backend to re-encode an exact
FP8 value, so no backend conversion rule is involved: neither the GPUs' (which differ in how they treat -0 and
saturation) nor the Triton interpreter's (whose fp32 -> fp8 cast has dropped the carry when the mantissa rounds up
to the next power of two, and since Triton 3.8 turns -0.0 into e4m3fnuz's NaN code 0x80).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def fp8_grid_params(fp8: torch.dtype) -> dict:
    """The constexprs :func:`round_to_fp8_grid` takes for ``fp8``: EMIN, the exponent of the smallest normal
    (e4m3fn 2**-6, e4m3fnuz 2**-7), and NEG_ZERO, whether the format has a -0 (e4m3fnuz has none: its 0x80 is NaN)."""
    return {"EMIN": int(math.log2(torch.finfo(fp8).tiny)), "NEG_ZERO": fp8 != torch.float8_e4m3fnuz}


@triton.jit
def round_to_fp8_grid(v, EMIN: tl.constexpr, NEG_ZERO: tl.constexpr):
    """fp32 ``v`` (|v| <= fp8 max) rounded to the nearest e4m3 value, ties to even, as an exact fp32: the grid step
    is 2**(e - 3) for |v| in [2**e, 2**(e+1)), e >= EMIN (2**(EMIN-3) below: subnormals); adding and removing
    1.5 * 2**(e + 20) (built from its bits: no product for FP fusion to fold into an FMA) makes the fp32 adder round
    at that step, to nearest even. What rounds to zero comes out +0; with NEG_ZERO the sign is put back, so that it
    stays -0 where v < 0 (as torch's cast does for e4m3fn)."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    big = (((e + 20 + 127) << 23) | 0x400000).to(tl.float32, bitcast=True)
    r = (v + big) - big
    if NEG_ZERO:
        r = (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)
    return r
