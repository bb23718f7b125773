"""``linear`` for the one row of a single-sequence decode step in Triton (a GEMV), the vendor BLAS for the rest.

At a few rows a linear layer reads its whole weight to do 2·M flops per element: it is a stream over W.
Program p owns rows [p*BLOCK_N, (p+1)*BLOCK_N) of W and walks K in BLOCK_K steps, keeping a
[BLOCK_M, BLOCK_N, BLOCK_K] fp32 partial product in registers and reducing over K once at the end: one kernel,
no split-K reduction launch (cuBLAS launches one for the narrow 8B projections). Any strides (x, W, bias); fp32
accumulation, bias added in fp32, one rounding to x's dtype.

The kernel computes up to ``KERNEL_MAX_M`` rows; ``supports`` takes only M <= ``MAX_M``, where it beat cuBLAS on
an H200 (benchmarks/gpu/gemv.py, 8B decode shapes, 2026-12-01): at M = 1 1.06x (qkv), 1.13x (o), 0.99-1.01x
(gate_up, down, lm_head), and one launch where cuBLAS makes two for o and down; at M = 2 it lost on four of the five
shapes (0.88-0.99x), at M = 4 on all (0.63-0.83x). Larger M is left to torch's ``F.linear`` (cuBLAS, hipBLASLt,
oneDNN: registered here below the GEMV as ``torch_blas``), what the models ran before this op existed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.core.ops.linear import linear

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10
MAX_M = 1  # rows the registered GEMV takes (see the module docstring)
KERNEL_MAX_M = 4  # rows triton_gemv computes (tests and the tuning sweep call it directly)

# (block_n, block_k, num_warps, num_stages) by M (rounded up to a power of two), from a sweep on an H200 over the
# Llama-3-8B decode shapes (benchmarks/gpu/gemv.py: 12 tiles; at M = 1 no other tile was more than 2% faster on any
# shape); fp32 weights take half the K step (twice the bytes per element).
CONFIGS = {1: (8, 512, 4, 3), 2: (4, 512, 4, 3), 4: (4, 256, 4, 3)}


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_xk, s_wn, s_wk, s_b, s_ym,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    nmask = rn < N
    mmask = rm < M
    rows = tl.where(nmask, rn, 0).to(tl.int64)  # rows past N re-read row 0 (never stored): W loads stay unmasked
    w_ptrs = w_ptr + rows[:, None] * s_wn + rk[None, :] * s_wk
    x_ptrs = x_ptr + rm[:, None] * s_xm + rk[None, :] * s_xk
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs)
            x = tl.load(x_ptrs, mask=mmask[:, None], other=0.0)
        else:
            kmask = (k + rk) < K
            w = tl.load(w_ptrs, mask=kmask[None, :], other=0.0)
            x = tl.load(x_ptrs, mask=mmask[:, None] & kmask[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        w_ptrs += BLOCK_K * s_wk
        x_ptrs += BLOCK_K * s_xk
    y = tl.sum(acc, axis=2)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn * s_b, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * s_ym + rn[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


def gemv_config(m: int, k: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, num_warps, num_stages) for M rows of x over K columns."""
    block_m = triton.next_power_of_2(m)
    block_n, block_k, warps, stages = CONFIGS[block_m]
    if dtype == torch.float32:
        block_k //= 2
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    return block_m, block_n, block_k, warps, stages


def triton_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``linear`` for x [M <= KERNEL_MAX_M, K]; ``config`` overrides gemv_config (tuning sweeps)."""
    m, k = x.shape
    if not 1 <= m <= KERNEL_MAX_M:
        raise ValueError(f"triton_gemv computes 1..{KERNEL_MAX_M} rows of x, got {m}; use F.linear")
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.copy_(bias.expand(m, n)) if bias is not None else y.zero_()
    block_m, block_n, block_k, warps, stages = config or gemv_config(m, k, x.dtype)
    b = bias if bias is not None else y
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, b, y, m, n, k, *x.stride(), *weight.stride(), b.stride(0) if bias is not None else 0, y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
        num_warps=warps, num_stages=stages)
    return y


def _supports_blas(device_type, x, weight, bias) -> bool | str:
    ts = (x, weight) + ((bias,) if bias is not None else ())
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return "x, weight (and bias) must be tensors"
    if any(t.device.type != device_type for t in ts):
        return f"tensors must be on {device_type}"
    return True


def _supports_gemv(device_type, x, weight, bias) -> bool | str:
    ok = _supports_blas(device_type, x, weight, bias)
    if ok is not True:
        return ok
    if x.dtype not in DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return f"x, weight and bias must share one dtype of {DTYPES}"
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        return "x must be [M, K] and weight [N, K]"
    if not 1 <= x.shape[0] <= MAX_M:
        return f"M = {x.shape[0]} rows: the GEMV takes {MAX_M} at most here (BLAS runs larger M)"
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        return "bias must be [N]"
    return True


def register(registry, device_type: str, capability=None) -> None:
    registry.register(linear, triton_gemv, name="triton_gemv", priority=PRIORITY,
                      supports=lambda *args: _supports_gemv(device_type, *args),
                      note=f"M <= {MAX_M}: one pass over W, no split-K reduction launch")
    registry.register(linear, F.linear, name="torch_blas", priority=0,
                      supports=lambda *args: _supports_blas(device_type, *args),
                      note="the vendor BLAS through torch's F.linear, for M > the GEMV's rows")
