"""RMSNorm in Triton: ``rms_norm`` and ``fused_add_rms_norm``, one program per row, fp32 math.

The reference's steps in its order: (for the fused op) ``s = (x + residual)`` rounded to x's dtype, then
``ms = sum(s^2) / H``, ``r = 1 / sqrt(ms + eps)`` (IEEE square root and division: ``tl.sqrt_rn`` and
``tl.math.div_rn``, not the approximate ``rsqrt``), ``y = (s * r) * weight`` and one rounding to x's dtype. Only the
order of the sum differs from torch's, which moves ``ms`` by an ulp or so: the bf16/fp16 outputs are the correctly
rounded ones but for an occasional tie-break.

Rows up to ``MAX_BLOCK`` elements are held in registers (one read); longer rows take two passes (the second re-reads
the row, from L2, and for the fused op recomputes ``x + residual`` rather than reading back its own stores).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.norm import fused_add_rms_norm, rms_norm
from engine.platforms.triton_kernels import interpreting

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10
MAX_BLOCK = 8192  # rows up to this many elements in one block; longer rows loop
LOOP_BLOCK = 4096


@triton.jit
def cast_rne(y, dtype: tl.constexpr, EMULATE: tl.constexpr):
    """``y.to(dtype)`` rounded to nearest even. The interpreter truncates fp32 -> bf16 (the GPU rounds): with EMULATE
    the rounding is done first in integer arithmetic (finite values), so its truncation is exact."""
    if EMULATE:
        if dtype == tl.bfloat16:
            bits = y.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            y = bits.to(tl.float32, bitcast=True)
    return y.to(dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, H, h_f, eps,
                     s_xm, s_xh, s_rm, s_rh, s_w, s_ym, s_sm,
                     FUSED: tl.constexpr, BLOCK: tl.constexpr, LOOP: tl.constexpr, EMULATE: tl.constexpr):
    """Row ``program_id``: y = (s * 1/sqrt(sum(s^2)/h_f + eps)) * w with s = x (or x + r rounded, FUSED: also
    stored). H is the row length, h_f the same as fp32."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * s_xm
    r_row = r_ptr + row * s_rm
    y_row = y_ptr + row * s_ym
    s_row = s_ptr + row * s_sm
    if LOOP:
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for h0 in range(0, H, BLOCK):
            m = h0 + offs < H
            x = tl.load(x_row + (h0 + offs) * s_xh, mask=m, other=0.0)
            if FUSED:
                x = (x.to(tl.float32) + tl.load(r_row + (h0 + offs) * s_rh, mask=m, other=0.0).to(tl.float32))
                x = cast_rne(x, y_ptr.dtype.element_ty, EMULATE)
                tl.store(s_row + h0 + offs, x, mask=m)
            xf = x.to(tl.float32)
            acc += xf * xf
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(acc, axis=0), h_f) + eps))
        for h0 in range(0, H, BLOCK):
            m = h0 + offs < H
            x = tl.load(x_row + (h0 + offs) * s_xh, mask=m, other=0.0)
            if FUSED:
                x = (x.to(tl.float32) + tl.load(r_row + (h0 + offs) * s_rh, mask=m, other=0.0).to(tl.float32))
                x = cast_rne(x, y_ptr.dtype.element_ty, EMULATE)
            w = tl.load(w_ptr + (h0 + offs) * s_w, mask=m, other=0.0).to(tl.float32)
            y = (x.to(tl.float32) * rstd) * w
            tl.store(y_row + h0 + offs, cast_rne(y, y_ptr.dtype.element_ty, EMULATE), mask=m)
    else:
        m = offs < H
        x = tl.load(x_row + offs * s_xh, mask=m, other=0.0)
        if FUSED:
            x = (x.to(tl.float32) + tl.load(r_row + offs * s_rh, mask=m, other=0.0).to(tl.float32))
            x = cast_rne(x, y_ptr.dtype.element_ty, EMULATE)
            tl.store(s_row + offs, x, mask=m)
        xf = x.to(tl.float32)
        ms = tl.math.div_rn(tl.sum(xf * xf, axis=0), h_f)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))
        w = tl.load(w_ptr + offs * s_w, mask=m, other=0.0).to(tl.float32)
        y = (xf * rstd) * w
        tl.store(y_row + offs, cast_rne(y, y_ptr.dtype.element_ty, EMULATE), mask=m)


def _launch_params(h: int) -> dict:
    if h > MAX_BLOCK:
        return dict(BLOCK=LOOP_BLOCK, LOOP=True, num_warps=8)
    block = triton.next_power_of_2(h)
    return dict(BLOCK=block, LOOP=False, num_warps=4 if block <= 1024 else (8 if block <= 4096 else 16))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])  # a view where strides allow, else a copy (inputs)


def _run(x, residual, weight, eps, fused):
    h = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if fused else y
    x2 = _rows(x)
    rows = x2.shape[0]
    if rows and h:
        r2 = _rows(residual) if fused else x2
        y2, s2 = y.view(rows, h), s.view(rows, h)
        _rms_norm_kernel[(rows,)](
            x2, r2, weight, y2, s2, h, float(h), float(eps),
            x2.stride(0), x2.stride(1), r2.stride(0), r2.stride(1), weight.stride(0), y2.stride(0), s2.stride(0),
            FUSED=fused, EMULATE=interpreting(), **_launch_params(h))
    return (y, s) if fused else y


def triton_rms_norm(x, weight, eps):
    return _run(x, None, weight, eps, False)


def triton_fused_add_rms_norm(x, residual, weight, eps):
    return _run(x, residual, weight, eps, True)


def _verdict(device_type, x, weight, residual=None) -> bool | str:
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return "x and weight must be tensors"
    ts = (x, weight) if residual is None else (x, weight, residual)
    if any(t.device.type != device_type for t in ts):
        return f"tensors must be on {device_type}"
    if x.dtype not in DTYPES or weight.dtype not in DTYPES:
        return f"x and weight dtypes must be in {DTYPES}, got {x.dtype}, {weight.dtype}"
    if x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        return f"x [..., H] and weight [H] expected, got {tuple(x.shape)} and {tuple(weight.shape)}"
    if residual is not None and (residual.shape != x.shape or residual.dtype not in DTYPES):
        return f"residual must be shaped like x {tuple(x.shape)}, got {tuple(residual.shape)} {residual.dtype}"
    return True


def register(registry, device_type: str, capability=None) -> None:
    registry.register(rms_norm, triton_rms_norm, name="triton_rms_norm", priority=PRIORITY,
                      supports=lambda x, weight, eps: _verdict(device_type, x, weight),
                      note="one program per row, fp32 math")
    registry.register(fused_add_rms_norm, triton_fused_add_rms_norm, name="triton_fused_add_rms_norm",
                      priority=PRIORITY, supports=lambda x, residual, weight, eps: _verdict(device_type, x, weight,
                                                                                            residual),
                      note="residual add + RMSNorm, one program per row, fp32 math")
