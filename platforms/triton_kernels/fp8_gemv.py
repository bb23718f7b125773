"""``fp8_linear`` for the few rows of x a decode step has: a GEMV on CUDA cores that streams the FP8 weight once.

At M = 1 a tensor-core GEMM (``torch._scaled_mm``, the Triton GEMM) pads x to a 16- or 64-row tile and reads the
weight through shared memory; the weight's bytes are all that matter there, and the H100 decode of an 8B-shaped FP8
model ran barely faster than bf16 (session 19, 1.07x). This kernel reads each weight row once with wide loads,
widens the FP8 codes to fp32 in registers (``.to(tl.float32)``: the hardware's e4m3x2 -> f16x2 conversion on sm_89+)
and multiplies by x's codes, also widened: every product of two FP8 values is exact in fp32, so the only rounding is
the fp32 accumulation (the reference accumulates in fp64; the op's tolerance covers the difference).

Scales as the op defines them (core/ops/fp8.py): per-tensor and per-row scales are constant along K and multiply the
fp32 row sums once at the end; 1x128 activation groups and 128x128 weight blocks vary along K, so each 128-wide
partial sum is scaled before it joins the accumulator (BLOCK_K is a multiple of 128 and every K split starts on a
block boundary). Tile: program (pid_n, pid_k) holds BLOCK_N rows of w and all M (<= GEMV_MAX_M) rows of x; K is split
(fp32 partials, one deterministic reduction launch) only while N alone gives too few programs to fill the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.core.ops.fp8 import fp8_linear
from engine.platforms.triton_kernels import interpreting, sm_count
from engine.platforms.triton_kernels.fp8_linear import (
    SCALE_BLOCK,
    TENSOR,
    native_fp8_dtypes,
    scale_layout,
    triton_supports_for,
)
from engine.platforms.triton_kernels.nvfp4 import split_plan, splitk_reduce

GEMV_MAX_M = 4  # rows of x up to which the GEMV runs (each row adds an FMA per weight byte); above: the GEMMs
PRIORITY = 30  # above torch._scaled_mm (20) and the Triton GEMM (10), for the calls it accepts (M <= GEMV_MAX_M)
PROGRAMS_PER_SM = 4  # K is split while N / BLOCK_N programs leave fewer than this per SM
INTERPRETER_SMS = 4  # a small fake SM count under the interpreter, so the split-K path runs in CI


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, out_ptr, xs_ptr, ws_ptr, part_ptr, M, N, K, k_per_split,
                     s_xm, s_wn, s_om, s_xsm, s_xsk, s_wsn, s_wsk,
                     X_MODE: tl.constexpr, W_MODE: tl.constexpr, SPLIT: tl.constexpr, SB: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] (or SPLIT: part[pid_k, m, n], fp32, scaled, no bias) = sum_k x[m, k] sx w[n, k] sw over this
    program's K range. Tiles are 3-D [BLOCK_M, BLOCK_N, BLOCK_K] (x broadcast over N, w over M), loaded straight
    in the full shape so both share one layout; the products accumulate elementwise and are reduced once at the end."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    rmask = rows < N
    mmask = ms < M
    w_rows = w_ptr + rows.to(tl.int64)[None, :, None] * s_wn  # [1, BN, 1]
    x_rows = x_ptr + ms.to(tl.int64)[:, None, None] * s_xm  # [BM, 1, 1]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    IN_LOOP: tl.constexpr = X_MODE == 2 or W_MODE == 2
    KB: tl.constexpr = BLOCK_K // SB
    if IN_LOOP:
        acc = tl.zeros([BLOCK_M, BLOCK_N, KB], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + kk
        kmask = (k < k_end)[None, None, :]
        w = tl.load(w_rows + k[None, None, :], mask=rmask[None, :, None] & kmask, other=0.0).to(tl.float32)
        # x loaded at w's full tile shape (each thread reads the x values of its own w bytes, from L1): both then get
        # one layout; loaded at [BLOCK_M, 1, BLOCK_K], w went through shared memory every step (4 barriers, sm_90 SASS)
        xp = tl.broadcast_to(x_rows + k[None, None, :], [BLOCK_M, BLOCK_N, BLOCK_K])
        xm = tl.broadcast_to(mmask[:, None, None] & kmask, [BLOCK_M, BLOCK_N, BLOCK_K])
        x = tl.load(xp, mask=xm, other=0.0).to(tl.float32)
        p = x * w  # exact: FP8 x FP8 fits fp32
        if IN_LOOP:
            pb = tl.sum(tl.reshape(p, [BLOCK_M, BLOCK_N, KB, SB]), axis=3)  # 128-wide partial sums
            kb = k0 // SB + tl.arange(0, KB)
            kbmask = kb * SB < k_end
            if X_MODE == 2:
                sx = tl.load(xs_ptr + ms[:, None] * s_xsm + kb[None, :] * s_xsk,
                             mask=mmask[:, None] & kbmask[None, :], other=0.0)
                pb = pb * sx[:, None, :]
            if W_MODE == 2:
                sw = tl.load(ws_ptr + (rows // SB)[:, None] * s_wsn + kb[None, :] * s_wsk,
                             mask=rmask[:, None] & kbmask[None, :], other=0.0)
                pb = pb * sw[None, :, :]
            acc += pb
        else:
            acc += p
    res = tl.sum(acc, axis=2)  # [BM, BN]
    if X_MODE == 0:
        res = res * tl.load(xs_ptr)
    elif X_MODE == 1:
        res = res * tl.load(xs_ptr + ms * s_xsm, mask=mmask, other=0.0)[:, None]
    if W_MODE == 0:
        res = res * tl.load(ws_ptr)
    elif W_MODE == 1:
        res = res * tl.load(ws_ptr + rows * s_wsn, mask=rmask, other=0.0)[None, :]
    omask = mmask[:, None] & rmask[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + ms.to(tl.int64))[:, None] * N + rows[None, :], res, mask=omask)
    else:
        tl.store(out_ptr + ms.to(tl.int64)[:, None] * s_om + rows[None, :], res.to(out_ptr.dtype.element_ty),
                 mask=omask)


def gemv_config(m: int) -> dict:
    """Tile for M rows of x: the elementwise accumulator is BLOCK_M x BLOCK_N x BLOCK_K / threads fp32 registers
    (32 at M = 1), so more rows of x take fewer rows of w. benchmarks/gpu/fp8.py --gemv sweeps alternatives."""
    if m == 1:
        return dict(block_n=8, block_k=512, num_warps=4, num_stages=2)
    # H100, CUDA-graph replays over 4 weight copies (2026-12-07): at M = 4 on 4096 x 14336 this tile took 55.4 us
    # against 100 for the (4, 256, 4 warps, 2 stages) one before it, and bf16 cuBLAS 56.2
    return dict(block_n=2, block_k=512, num_warps=2, num_stages=3)


def fp8_gemv_linear(x_q, x_scale, w_q, w_scale, bias, out_dtype, config: dict | None = None):
    """fp8_linear for M <= GEMV_MAX_M on the GEMV; ``config`` overrides :func:`gemv_config` (block_n, block_k,
    num_warps, num_stages, splits) for the benchmark's sweep."""
    (m, k), n = x_q.shape, w_q.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(out))
    xl = scale_layout(x_scale, m, k, 1)
    wl = scale_layout(w_scale, n, k, SCALE_BLOCK)
    cfg = gemv_config(m)
    cfg.update(config or {})
    block_k = cfg["block_k"]
    if block_k % SCALE_BLOCK or triton.next_power_of_2(block_k // SCALE_BLOCK) != block_k // SCALE_BLOCK:
        raise ValueError(f"fp8 GEMV block_k must be {SCALE_BLOCK} times a power of two, got {block_k}")
    block_k = min(block_k, triton.next_power_of_2(triton.cdiv(k, SCALE_BLOCK)) * SCALE_BLOCK)
    programs = triton.cdiv(n, cfg["block_n"])
    steps = triton.cdiv(k, block_k)
    splits, per_split = split_plan(programs, steps, block_k, sm_count(x_q.device, INTERPRETER_SMS), PROGRAMS_PER_SM,
                                   cfg.get("splits"))
    xs2 = x_scale.reshape(1, 1) if xl == TENSOR else x_scale
    ws2 = w_scale.reshape(1, 1) if wl == TENSOR else w_scale
    if x_q.stride(1) != 1:
        x_q = x_q.contiguous()
    if w_q.stride(1) != 1:
        w_q = w_q.contiguous()
    direct = splits == 1 and bias is None
    part = out if direct else torch.empty((splits, m, n), dtype=torch.float32, device=x_q.device)
    _fp8_gemv_kernel[(programs, splits)](
        x_q, w_q, out, xs2, ws2, part, m, n, k, per_split, x_q.stride(0), w_q.stride(0), out.stride(0),
        xs2.stride(0), xs2.stride(1), ws2.stride(0), ws2.stride(1), X_MODE=xl, W_MODE=wl, SPLIT=not direct,
        SB=SCALE_BLOCK, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=cfg["block_n"], BLOCK_K=block_k,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    # the reference adds the bias to the fp32 product before its one rounding: so does the reduction
    return out if direct else splitk_reduce(part, bias, out)


def gemv_verdict(x_q, lay) -> bool | str:
    """The GEMV's own condition on a well-formed fp8_linear call (any scale layouts ``lay``): few rows of x."""
    if x_q.shape[0] > GEMV_MAX_M:
        return f"the FP8 GEMV takes at most {GEMV_MAX_M} rows of x (decode); got {x_q.shape[0]}: the GEMMs run it"
    return True


def register(registry, device_type: str, capability=None) -> None:
    """``triton_fp8_gemv`` where the Triton FP8 GEMM runs (the device's FP8 flavour, or the interpreter)."""
    native = native_fp8_dtypes(device_type, capability)
    if (native or interpreting()) and not (device_type == "cuda" and capability is not None
                                           and tuple(capability) < (8, 9)):
        registry.register(fp8_linear, fp8_gemv_linear, name="triton_fp8_gemv",
                          supports=triton_supports_for(device_type, capability, gemv_verdict), priority=PRIORITY,
                          note=f"Triton FP8 GEMV on CUDA cores for M <= {GEMV_MAX_M} (decode): every scale layout, "
                               "split-K when N is small")
    else:
        registry.skip(fp8_linear, "triton_fp8_gemv", f"no native FP8 flavour on {device_type} (capability "
                                                     f"{capability})")
