"""``int8_linear`` in Triton: 8-bit group-quantized weights (core/ops/int8.py's layout: GPTQ 8-bit, compressed-tensors
W8A16, GGUF Q8_0 as groups of 32) multiplied without expanding them.

* M <= GEMV_DEFAULT_MAX_M (decode): CUDA cores. Tiles [BLOCK_M, BLOCK_N, BLOCK_K] with the codes read 16 bytes a
  load and x read at the same tile shape (so both have one layout, as in fp8_gemv.py). A code becomes fp32 by the
  exponent trick (``code | 0x4B000000`` is 2**23 + code, exactly), minus 2**23 + 128 for symmetric weights: the integer
  ``code - 128``. Products are summed per 16 codes (never across a group: groups are multiples of 32) and scaled
  there; with zero points, ``sum((code - z) x) = sum((code - 128) x) - (z - 128) sum(x)``.
* larger M: tensor cores, swap AB (the weight tile [BLOCK_N, BLOCK_K] is the left operand): a K step lies inside one
  group, its codes become the integers ``code - zero`` (exact in bf16 and fp16: |v| <= 255) and each step's dot is
  scaled by its group's scales as it is added up (fp32).
K is split (fp32 partials, one reduction launch) while N alone leaves SMs idle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.int8 import check_int8, int8_linear
from engine.platforms.triton_kernels import interpreting, sm_count
from engine.platforms.triton_kernels.group_quant import choose_kernel, group_supports, launch_operands
from engine.platforms.triton_kernels.nvfp4 import split_plan, splitk_reduce

PRIORITY = 10
GEMV_MAX_M = 4
# Rows of x up to which the GEMV is the default (it takes up to GEMV_MAX_M): H100, 2026-12-08 (benchmarks/gpu/int8.py):
# the GEMV at M = 4 ran 0.61-0.78x cuBLAS bf16, the tensor-core kernel at M = 16 0.91-1.05x
GEMV_DEFAULT_MAX_M = 2
SUB = 16  # codes summed before their scale is applied (a divisor of every group size)
PROGRAMS_PER_SM = 4  # K is split while N / BLOCK_N programs leave fewer than this per SM
DOT_PROGRAMS_PER_SM = 4
INTERPRETER_SMS = 4  # a small fake SM count under the interpreter, so the split-K paths run in CI


@triton.jit
def _codes(w, c):
    """uint8 codes -> fp32 ``code + 2**23 - c`` (c = 2**23 + zero: the integer ``code - zero``), exact."""
    return (w.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - c


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, part_ptr, M, N, K, k_per_split, stride_xm, stride_wn,
                 stride_sn, stride_zn, stride_om, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """out[m, n] (or SPLIT: fp32 part[pid_k, m, n], no bias) over this program's K range; tiles [BM, BN, BK]
    accumulated per SUB codes ([BM, BN, BK / SUB] fp32) and reduced once at the end."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    SB: tl.constexpr = 16
    KB: tl.constexpr = BLOCK_K // SB
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    rmask = rows < N
    mmask = ms < M
    rows64 = rows.to(tl.int64)
    w_rows = w_ptr + rows64[None, :, None] * stride_wn  # [1, BN, 1]
    x_rows = x_ptr + ms.to(tl.int64)[:, None, None] * stride_xm  # [BM, 1, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N, KB], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + kk
        kmask = (k < k_end)[None, None, :]
        w = tl.load(w_rows + k[None, None, :], mask=rmask[None, :, None] & kmask, other=128)
        # x at the full tile shape: each thread reads the x of its own codes (L1), and both share one layout
        xp = tl.broadcast_to(x_rows + k[None, None, :], [BLOCK_M, BLOCK_N, BLOCK_K])
        xm = tl.broadcast_to(mmask[:, None, None] & kmask, [BLOCK_M, BLOCK_N, BLOCK_K])
        x = tl.load(xp, mask=xm, other=0.0).to(tl.float32)
        p = tl.sum(tl.reshape(_codes(w, 8388736.0) * x, [BLOCK_M, BLOCK_N, KB, SB]), axis=3)  # (code - 128) x
        g = (k0 + tl.arange(0, KB) * SB) // GROUP  # each sub-block's group
        gmask = rmask[:, None] & ((k0 + tl.arange(0, KB) * SB) < k_end)[None, :]
        s = tl.load(s_ptr + rows64[:, None] * stride_sn + g[None, :], mask=gmask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + rows64[:, None] * stride_zn + g[None, :], mask=gmask, other=128).to(tl.float32)
            xs = tl.sum(tl.reshape(x, [BLOCK_M, BLOCK_N, KB, SB]), axis=3)
            p = p - (z[None, :, :] - 128.0) * xs
        acc += p * s[None, :, :]
    res = tl.sum(acc, axis=2)  # [BM, BN]
    omask = mmask[:, None] & rmask[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + ms.to(tl.int64))[:, None] * N + rows[None, :], res, mask=omask)
    else:
        if HAS_BIAS:
            res += tl.load(bias_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + ms.to(tl.int64)[:, None] * stride_om + rows[None, :], res.to(out_ptr.dtype.element_ty),
                 mask=omask)


@triton.jit
def _dot_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, part_ptr, M, N, K, k_per_split, stride_xm, stride_wn,
                stride_sn, stride_zn, stride_om, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
                SPLIT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """Tensor cores, swap AB: out^T [BLOCK_N, BLOCK_M] += s * (W codes - zero) [BLOCK_N, BLOCK_K] @ x^T; a K step
    lies in one group (BLOCK_K divides GROUP, or the group is the whole row), so its dot is scaled once by the
    step's [BLOCK_N] scales."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    rmask = rows < N
    mmask = ms < M
    rows64 = rows.to(tl.int64)
    w_rows = w_ptr + rows64[:, None] * stride_wn
    x_cols = x_ptr + ms.to(tl.int64)[None, :] * stride_xm
    DT: tl.constexpr = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + kk
        kmask = k < k_end
        w = tl.load(w_rows + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0)
        g = k0 // GROUP
        s = tl.load(s_ptr + rows64 * stride_sn + g, mask=rmask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            c = tl.load(z_ptr + rows64 * stride_zn + g, mask=rmask, other=0).to(tl.float32) + 8388608.0
            a = _codes(w, c[:, None])
        else:
            a = _codes(w, 8388736.0)
        xt = tl.load(x_cols + k[:, None], mask=kmask[:, None] & mmask[None, :], other=0.0)
        if INTERPRET:  # the interpreter's 16-bit dot is wrong; fp32 tiles (of the same integers) are right
            step = tl.dot(a, xt.to(tl.float32))
        elif DT == tl.float32:
            step = tl.dot(a, xt, input_precision="ieee")
        else:
            step = tl.dot(a.to(DT), xt)  # integers of magnitude <= 255: exact in bf16 and fp16
        acc += step * s[:, None]
    omask = rmask[:, None] & mmask[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + ms.to(tl.int64))[None, :] * N + rows[:, None], acc, mask=omask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + ms.to(tl.int64)[None, :] * stride_om + rows[:, None], acc.to(out_ptr.dtype.element_ty),
                 mask=omask)


def gemv_config(m: int) -> dict:
    """Tile for M rows of x (more rows of x take fewer rows of W: the accumulator is BM x BN x BK / 16 / threads)."""
    if m == 1:
        return dict(block_n=8, block_k=512, num_warps=4, num_stages=2)
    return dict(block_n=4, block_k=256, num_warps=4, num_stages=2)


def dot_config(m: int, k: int, group_size: int, dtype: torch.dtype) -> dict:
    """Tensor-core tile: BLOCK_K a power of two dividing the group (the whole row: any), at most 128."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_k = 128
    if group_size < k:
        while group_size % block_k:
            block_k //= 2
    if dtype == torch.float32:
        return dict(block_m=block_m, block_n=64, block_k=min(block_k, 64), num_warps=4, num_stages=2)
    return dict(block_m=block_m, block_n=128, block_k=block_k, num_warps=8 if block_m >= 64 else 4, num_stages=4)


def int8_linear_triton(x, w_codes, w_scale, w_zero, group_size, bias=None, *, kernel: str | None = None,
                       config: dict | None = None):
    """int8_linear: out [M, N] = x @ dequant(w)^T (+ bias) in x.dtype. ``kernel`` ("gemv" or "dot") and ``config``
    (block sizes, warps, stages, splits) override the heuristics for the benchmark's sweep."""
    x, out, zero, bias, bias_arg = launch_operands(x, w_codes, w_scale, w_zero, bias)
    (m, k), n = x.shape, out.shape[1]
    if m == 0 or n == 0:
        return out
    has_zero, has_bias = w_zero is not None, bias is not None
    cfg = dict(config or {})
    sms = cfg.get("sms", sm_count(x.device, INTERPRETER_SMS))
    if choose_kernel(kernel, m, GEMV_DEFAULT_MAX_M, GEMV_MAX_M) == "gemv":
        gc = gemv_config(m)
        gc.update(cfg)
        programs = triton.cdiv(n, gc["block_n"])
        splits, per_split = split_plan(programs, triton.cdiv(k, gc["block_k"]), gc["block_k"], sms, PROGRAMS_PER_SM,
                                       cfg.get("splits"))
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
        _gemv_kernel[(programs, splits)](
            x, w_codes, w_scale, zero, bias_arg, out, part, m, n, k, per_split, x.stride(0), w_codes.stride(0),
            w_scale.stride(0), zero.stride(0), out.stride(0), GROUP=group_size, HAS_ZERO=has_zero,
            HAS_BIAS=has_bias, SPLIT=splits > 1, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=gc["block_n"],
            BLOCK_K=gc["block_k"], num_warps=gc["num_warps"], num_stages=gc["num_stages"])
        return splitk_reduce(part, bias, out) if splits > 1 else out
    dc = dot_config(m, k, group_size, x.dtype)
    dc.update(cfg)
    if group_size < k and group_size % dc["block_k"]:
        raise ValueError(f"block_k {dc['block_k']} must divide the group size {group_size}")
    programs = triton.cdiv(n, dc["block_n"]) * triton.cdiv(m, dc["block_m"])
    splits, per_split = split_plan(programs, triton.cdiv(k, dc["block_k"]), dc["block_k"], sms, DOT_PROGRAMS_PER_SM,
                                   cfg.get("splits"))
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    _dot_kernel[(triton.cdiv(n, dc["block_n"]), triton.cdiv(m, dc["block_m"]), splits)](
        x, w_codes, w_scale, zero, bias_arg, out, part, m, n, k, per_split, x.stride(0), w_codes.stride(0),
        w_scale.stride(0), zero.stride(0), out.stride(0), GROUP=group_size, HAS_ZERO=has_zero, HAS_BIAS=has_bias,
        SPLIT=splits > 1, INTERPRET=interpreting(), BLOCK_M=dc["block_m"], BLOCK_N=dc["block_n"],
        BLOCK_K=dc["block_k"], num_warps=dc["num_warps"], num_stages=dc["num_stages"])
    return splitk_reduce(part, bias, out) if splits > 1 else out


def supports_for(device_type: str):
    return group_supports(device_type, check_int8, "w_codes")


def register(registry, device_type: str, capability=None) -> None:
    registry.register(int8_linear, int8_linear_triton, name="triton_int8_w8a16", supports=supports_for(device_type),
                      priority=PRIORITY,
                      note=f"Triton W8A16 for GPTQ 8-bit / GGUF Q8_0 weights: CUDA-core GEMV with 16-byte code "
                           f"loads for M <= {GEMV_DEFAULT_MAX_M} (split-K when N is small), tensor cores above")
