"""``silu_and_mul`` in Triton: out = silu(gate) * up, gate and up the two halves of x's last dimension.

fp32 math in the reference's order: ``silu(g) = g / (1 + exp(-g))`` (IEEE division, ``tl.math.div_rn``), times up,
one rounding to x's dtype. Program (row, j) covers columns [j*BLOCK, (j+1)*BLOCK) of one row of the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.activation import silu_and_mul
from engine.platforms.triton_kernels import interpreting
from engine.platforms.triton_kernels.norm import cast_rne

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10
MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, y_ptr, D, s_xm, s_xd, s_ym, BLOCK: tl.constexpr, EMULATE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < D
    x_row = x_ptr + row * s_xm
    g = tl.load(x_row + cols * s_xd, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_row + (cols + D) * s_xd, mask=m, other=0.0).to(tl.float32)
    y = tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + row * s_ym + cols, cast_rne(y, y_ptr.dtype.element_ty, EMULATE), mask=m)


def triton_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    y = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    x2 = x if x.dim() == 2 else x.reshape(-1, 2 * d)
    rows = x2.shape[0]
    if rows and d:
        block = min(triton.next_power_of_2(d), MAX_BLOCK)
        y2 = y.view(rows, d)
        _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
            x2, y2, d, x2.stride(0), x2.stride(1), y2.stride(0), BLOCK=block, EMULATE=interpreting(), num_warps=4)
    return y


def _supports(device_type: str, x) -> bool | str:
    if not isinstance(x, torch.Tensor) or x.device.type != device_type:
        return f"x must be a tensor on {device_type}"
    if x.dtype not in DTYPES:
        return f"x.dtype must be one of {DTYPES}, got {x.dtype}"
    if x.dim() < 1 or x.shape[-1] % 2:
        return f"x must be [..., 2*d], got {tuple(x.shape)}"
    return True


def register(registry, device_type: str, capability=None) -> None:
    registry.register(silu_and_mul, triton_silu_and_mul, name="triton_silu_and_mul", priority=PRIORITY,
                      supports=lambda x: _supports(device_type, x), note="fp32 math, one rounding")
