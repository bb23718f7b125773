"""W8A8 FP8 linear (``fp8_linear``) and dynamic activation quantization (``fp8_quantize_per_token``).

Three implementations:

* ``scaled_mm`` (``fp8_linear``, highest priority): ``torch._scaled_mm`` (cuBLASLt / CUTLASS / hipBLASLt) for
  per-tensor scales and per-row scales (per-token x and/or per-channel w; a per-tensor scale on one side is
  expanded to a row of scales). Gated on a CUDA/HIP device, capability >= 8.9 where the capability is known, the
  device's FP8 flavour, contiguous operands (``mat2 = w_q.t()`` is then column-major), K and N multiples of 16, and
  for row-wise scales a bf16 output (fp32 and fp16 outputs are only sure with per-tensor scales). :func:`scaled_mm_args`
  is the pure argument preparation (what the tests check without a GPU).
* ``triton_fp8_gemm`` (``fp8_linear``): one Triton GEMM for every scale layout the op defines: per-tensor, per-row,
  1x128 activation groups and 128x128 weight blocks, in any combination. FP8 tiles go straight into ``tl.dot``
  (tensor cores, fp32 accumulate). A scale that varies along K (groups / blocks) is applied to each 128-deep partial
  product before it joins the fp32 accumulator (DeepSeek's promotion); a scale constant along K is applied once to
  the accumulator at the end. Under the interpreter the tiles are widened to fp32 first (``tl.dot`` on narrow
  floats is not reliable there).
* ``triton_quant`` (``fp8_quantize_per_token``): one program per token (per-token scales), or per token and run of
  1xG groups. Bit-exact with the reference: IEEE divisions (``tl.math.div_rn``; ``/`` on fp32 is approximate on
  NVIDIA) and rounding to the FP8 grid done in fp32 arithmetic (``fp8_grid.round_to_fp8_grid``), so no backend
  conversion rule is involved (see that module): the final cast only re-encodes an exact value.

Nothing here syncs with the host: shapes pick configurations, values never do (CUDA-graph capturable).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine.core.ops.fp8 import BLOCK_K as SCALE_BLOCK
from engine.core.ops.fp8 import FP8_DTYPES, fp8_linear
from engine.core.ops.fp8_quant import X_DTYPES, fp8_quantize_per_token, scale_shape
from engine.platforms.triton_kernels import interpreting
from engine.platforms.triton_kernels.fp8_grid import fp8_grid_params, round_to_fp8_grid

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PRIORITY = 10  # the Triton kernels: above the reference
SCALED_MM_PRIORITY = 20  # torch._scaled_mm where it applies: above the Triton GEMM

_TL_FP8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e4m3fnuz: tl.float8e4b8}

# scale layouts (core/ops/fp8.py): one value, one per row, one per (row block, 128-wide K block)
TENSOR, ROW, BLOCK = 0, 1, 2
_LAYOUT_NAMES = {TENSOR: "per-tensor", ROW: "per-row", BLOCK: "block"}


def scale_layout(scale: torch.Tensor, rows: int, k: int, block_rows: int) -> int | str:
    """TENSOR, ROW or BLOCK for a scale of the operand ``[rows, k]`` (block rows: 1 for x, 128 for w), read from its
    shape exactly as the reference reads it; a reason string when it is none of them."""
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        return "scales must be float32 tensors"
    if scale.numel() == 1 and scale.dim() <= 2:
        return TENSOR
    if tuple(scale.shape) == (rows, 1):
        return ROW
    if tuple(scale.shape) == (math.ceil(rows / block_rows), math.ceil(k / SCALE_BLOCK)):
        return BLOCK
    return f"scale shape {tuple(scale.shape)} is no layout of a [{rows}, {k}] operand"


def _operands_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, device_type):
    """(x layout, w layout) when the arguments are a well-formed fp8_linear call on ``device_type``, else a reason."""
    if not all(isinstance(t, torch.Tensor) for t in (x_q, x_scale, w_q, w_scale)):
        return "x_q, x_scale, w_q and w_scale must be tensors"
    if x_q.dtype not in _TL_FP8 or w_q.dtype != x_q.dtype:
        return f"x_q and w_q must share float8_e4m3fn or float8_e4m3fnuz, got {x_q.dtype} / {w_q.dtype}"
    if x_q.dim() != 2 or w_q.dim() != 2 or x_q.shape[1] != w_q.shape[1]:
        return f"x_q [M, K] and w_q [N, K] expected, got {tuple(x_q.shape)} and {tuple(w_q.shape)}"
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}"
    tensors = (x_q, x_scale, w_q, w_scale) + ((bias,) if bias is not None else ())
    if any(t.device.type != device_type for t in tensors):
        return f"tensors must be on {device_type}"
    (m, k), n = x_q.shape, w_q.shape[0]
    if bias is not None and (bias.dtype not in OUT_DTYPES or tuple(bias.shape) != (n,)):
        return f"bias must be a float tensor [N={n}]"
    xl = scale_layout(x_scale, m, k, 1)
    wl = scale_layout(w_scale, n, k, SCALE_BLOCK)
    if isinstance(xl, str) or isinstance(wl, str):
        return f"x_scale: {xl}" if isinstance(xl, str) else f"w_scale: {wl}"
    return xl, wl


def _is_hip() -> bool:
    return getattr(torch.version, "hip", None) is not None


def _hip_fp8_dtype() -> torch.dtype | None:
    """The FP8 flavour of the first HIP device's matrix cores (e4m3fnuz on MI300's gfx94x, e4m3fn after)."""
    try:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    except Exception:
        return None
    return torch.float8_e4m3fnuz if arch in ("gfx940", "gfx941", "gfx942") else torch.float8_e4m3fn


def native_fp8_dtypes(device_type: str, capability) -> tuple[torch.dtype, ...]:
    """The FP8 flavours the device's tensor cores multiply, as seen from ``register`` (no tensor involved)."""
    if device_type == "cuda":
        if _is_hip():
            dt = _hip_fp8_dtype()
            return (dt,) if dt is not None else ()
        if capability is None or tuple(capability) >= (8, 9):
            return (torch.float8_e4m3fn,)
        return ()
    if device_type == "xpu":
        return (torch.float8_e4m3fn,)
    return ()


# ---------------------------------------------------------------------------------------------------------------
# torch._scaled_mm


def scaled_mm_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype) -> bool | str:
    """Whether ``torch._scaled_mm`` computes this fp8_linear call (shape, dtype and layout rules only; device and
    capability are :func:`register`'s business). True or the reason why not."""
    lay = _operands_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, x_q.device.type)
    if isinstance(lay, str):
        return lay
    xl, wl = lay
    if BLOCK in lay:
        return f"{_LAYOUT_NAMES[xl]} x / {_LAYOUT_NAMES[wl]} w scales: block scales go to the Triton GEMM"
    (m, k), n = x_q.shape, w_q.shape[0]
    if k % 16 or n % 16:
        return f"_scaled_mm needs K and N multiples of 16, got K={k}, N={n}"
    if not (x_q.is_contiguous() and w_q.is_contiguous()):
        return "_scaled_mm needs row-major x_q and w_q (mat2 = w_q.t() column-major)"
    if m == 0:
        return "empty x"
    if (xl, wl) != (TENSOR, TENSOR):  # row-wise: CUTLASS / cuBLAS take a bf16 output and a bf16 bias
        if out_dtype != torch.bfloat16:
            return f"row-wise _scaled_mm gives bf16 output only, not {out_dtype}"
        if bias is not None and bias.dtype != torch.bfloat16:
            return f"row-wise _scaled_mm takes a bf16 bias only, not {bias.dtype}"
    return True


def scaled_mm_args(x_q, x_scale, w_q, w_scale, bias, out_dtype) -> tuple[dict, torch.Tensor | None, torch.dtype | None]:
    """The ``torch._scaled_mm`` keyword arguments for an fp8_linear call :func:`scaled_mm_verdict` accepts, plus what
    is left to do after it: ``(kwargs, post_bias, cast_to)``: ``out = _scaled_mm(mat1, mat2, scale_a, scale_b,
    bias=..., out_dtype=...)`` from kwargs (the first four are positional in torch's schema), then
    ``out += post_bias`` (fp32, in place) when it is not None, then ``out = out.to(cast_to)`` when that is not None.

    Per-tensor on both sides: 0-d scales. Otherwise row-wise: scale_a [M, 1], scale_b [1, N] (a per-tensor side is
    expanded). The bias goes into the GEMM epilogue when its dtype is the bf16/fp16 output's (cuBLASLt adds it in fp32
    before the one rounding, as the reference does); otherwise (fp32 output, or another bias dtype) the GEMM writes
    fp32, the bias is added in fp32 and the result cast once, the reference's order.
    """
    m, n = x_q.shape[0], w_q.shape[0]
    xl = scale_layout(x_scale, m, x_q.shape[1], 1)
    wl = scale_layout(w_scale, n, w_q.shape[1], SCALE_BLOCK)
    if (xl, wl) == (TENSOR, TENSOR):
        scale_a, scale_b = x_scale.reshape(()), w_scale.reshape(())
    else:
        scale_a = x_scale.reshape(1, 1).expand(m, 1) if xl == TENSOR else x_scale
        scale_b = w_scale.reshape(1, 1).expand(1, n) if wl == TENSOR else w_scale.reshape(1, n)
        scale_a, scale_b = scale_a.contiguous(), scale_b.contiguous()
    kwargs = dict(mat1=x_q, mat2=w_q.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    post_bias, cast_to = None, None
    if bias is not None:
        if bias.dtype == out_dtype and out_dtype in (torch.bfloat16, torch.float16):
            kwargs["bias"] = bias
        else:
            kwargs["out_dtype"] = torch.float32
            post_bias = bias.float()
            cast_to = None if out_dtype == torch.float32 else out_dtype
    return kwargs, post_bias, cast_to


def scaled_mm_linear(x_q, x_scale, w_q, w_scale, bias, out_dtype):
    kw, post_bias, cast_to = scaled_mm_args(x_q, x_scale, w_q, w_scale, bias, out_dtype)
    out = torch._scaled_mm(kw["mat1"], kw["mat2"], kw["scale_a"], kw["scale_b"], bias=kw.get("bias"),
                           out_dtype=kw["out_dtype"])
    if post_bias is not None:
        out.add_(post_bias)
    return out if cast_to is None else out.to(cast_to)


# ---------------------------------------------------------------------------------------------------------------
# Triton GEMM


@triton.jit
def _dot(a, b, WIDEN: tl.constexpr):
    if WIDEN:  # interpreter: fp32 tiles, exact products
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _step_scales(xs_ptrs, ws_ptrs, kb, s_xsk, s_wsk, X_MODE: tl.constexpr, W_MODE: tl.constexpr):
    """The scales of K block kb that vary along K: x's per row [BLOCK_M] (X_MODE 2), w's per column [BLOCK_N] or,
    W_ONE, one per tile (W_MODE 2); a side without block scales gives 1.0 (never used)."""
    sx = 1.0
    sw = 1.0
    if X_MODE == 2:
        sx = tl.load(xs_ptrs + kb * s_xsk)
    if W_MODE == 2:
        sw = tl.load(ws_ptrs + kb * s_wsk)
    return sx, sw


@triton.jit
def _add_scaled(acc, part, sx, sw, X_MODE: tl.constexpr, W_MODE: tl.constexpr, W_ONE: tl.constexpr):
    """acc + part * (the step's scales, from :func:`_step_scales`)."""
    if X_MODE == 2:
        if W_MODE != 2:
            acc += part * sx[:, None]
        elif W_ONE:
            acc += part * (sx * sw)[:, None]
        else:
            acc += part * (sx[:, None] * sw[None, :])
    elif W_ONE:
        acc += part * sw
    else:
        acc += part * sw[None, :]
    return acc


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K,
                     s_xm, s_xk, s_wn, s_wk, s_om, s_on, s_xsm, s_xsk, s_wsn, s_wsk, s_b,
                     X_MODE: tl.constexpr, W_MODE: tl.constexpr, IN_LOOP: tl.constexpr,
                     W_ONE: tl.constexpr, HAS_BIAS: tl.constexpr, WIDEN: tl.constexpr,
                     EVEN_K: tl.constexpr, I64: tl.constexpr, SB: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     PREFETCH: tl.constexpr = False, DEFER: tl.constexpr = False, TMA: tl.constexpr = False):
    """out[M, N] = (x * sx) @ (w * sw)^T (+ bias). Modes 0/1/2: per-tensor / per-row / block (SB-wide along K).

    A scale constant along K multiplies the accumulator once at the end; a block scale (IN_LOOP) multiplies each
    BLOCK_K-deep partial product before it joins the fp32 accumulator (BLOCK_K divides SB: one scale per row / column
    per step). W_ONE: BLOCK_N divides SB, so a tile's columns share one weight block (one scale per step).

    Block-scale variants (IN_LOOP; benchmarks/gpu/fp8.py sweeps them): PREFETCH loads the next step's scales one
    step ahead (registers), so no scale load waits behind the product it scales; DEFER scales step k's product only
    after step k+1's dot is issued (the product is carried one step), so the scaling FMAs sit beside a running
    wgmma instead of behind it; TMA: x_ptr / w_ptr are tensor descriptors ([BLOCK_M, BLOCK_K] / [BLOCK_N, BLOCK_K]
    boxes, zero-filled out of range) and the tiles come through the bulk tensor copy engine (Hopper) instead of
    per-thread copies."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n  # grouped launch order: GROUP_M row tiles share each weight tile while it is in L2
    first_m = (pid // width) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_rows
    pid_n = (pid % width) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = offs_m % M  # out-of-range rows/columns re-read valid ones; the store masks them
    rn = offs_n % N
    if I64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    if TMA:
        a_ptrs = 0  # unused: the descriptors take coordinates
        b_ptrs = 0
    else:
        a_ptrs = x_ptr + rm[:, None] * s_xm + offs_k[None, :] * s_xk
        b_ptrs = w_ptr + rn[None, :] * s_wn + offs_k[:, None] * s_wk
    xs_ptrs = xs_ptr
    ws_ptrs = ws_ptr
    if X_MODE == 2:
        xs_ptrs = xs_ptr + rm * s_xsm
    if W_MODE == 2:
        if W_ONE:
            ws_ptrs = ws_ptr + ((pid_n * BLOCK_N) // SB) * s_wsn
        else:
            ws_ptrs = ws_ptr + (rn // SB) * s_wsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    nk = tl.cdiv(K, BLOCK_K)
    if IN_LOOP:
        sx, sw = _step_scales(xs_ptrs, ws_ptrs, 0, s_xsk, s_wsk, X_MODE, W_MODE)
        prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        psx = sx
        psw = sw
    for kt in range(0, nk):
        k0 = kt * BLOCK_K
        if TMA:
            a = x_ptr.load([pid_m * BLOCK_M, k0])
            b = w_ptr.load([pid_n * BLOCK_N, k0]).T
        elif EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k0, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k0, other=0.0)
        if IN_LOOP:
            # a fresh product each step, scaled before it joins the fp32 accumulator: on Hopper the wgmma is waited
            # for before it is scaled (two programs per SM, or DEFER, keep the tensor cores busy meanwhile)
            if not PREFETCH:
                sx, sw = _step_scales(xs_ptrs, ws_ptrs, k0 // SB, s_xsk, s_wsk, X_MODE, W_MODE)
            part = _dot(a, b, WIDEN)
            if DEFER:
                acc = _add_scaled(acc, prev, psx, psw, X_MODE, W_MODE, W_ONE)  # zero product at kt == 0
                prev = part
                psx = sx
                psw = sw
            else:
                acc = _add_scaled(acc, part, sx, sw, X_MODE, W_MODE, W_ONE)
            if PREFETCH:  # the next step's scales (the last step re-reads its own: in range, unused)
                sx, sw = _step_scales(xs_ptrs, ws_ptrs, (tl.minimum(kt + 1, nk - 1) * BLOCK_K) // SB, s_xsk, s_wsk,
                                      X_MODE, W_MODE)
        elif WIDEN:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            # promoted to the fp32 accumulator every BLOCK_K: Triton's sm_90 default keeps the wgmma's truncating
            # FP8 accumulation over all of K (0.5% off at K = 3,584 on an H100, past the kit's bound)
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K * s_xk
        b_ptrs += BLOCK_K * s_wk
    if IN_LOOP and DEFER:
        acc = _add_scaled(acc, prev, psx, psw, X_MODE, W_MODE, W_ONE)

    if X_MODE == 0:
        acc = acc * tl.load(xs_ptr)
    elif X_MODE == 1:
        acc = acc * tl.load(xs_ptr + rm * s_xsm)[:, None]
    if W_MODE == 0:
        acc = acc * tl.load(ws_ptr)
    elif W_MODE == 1:
        acc = acc * tl.load(ws_ptr + rn * s_wsn)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn * s_b).to(tl.float32)[None, :]
    om = offs_m
    on = offs_n
    if I64:
        om = om.to(tl.int64)
        on = on.to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + om[:, None] * s_om + on[None, :] * s_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


def gemm_config(m: int, n: int, k: int, in_loop_scales: bool) -> dict:
    """Tile configuration by shape, fixed (no autotuning: it would time kernels, and sync, inside a captured graph).

    Block scales (the partial products are scaled in registers): 64x128 tiles, 4 warps, 4 stages, tiles loaded
    through tensor descriptors (TMA): the fastest correct variant of the H200 sweep (2026-12-01: 0.70x / 0.66x
    _scaled_mm per-tensor at 4096 / 8192, against 0.63x / 0.62x for pointer loads). Scales constant along K (the
    accumulator stays in the tensor cores): 128x128, 8 warps, 4 stages. Few rows (decode): small M tiles and narrow N
    tiles, so enough programs stream the weight. benchmarks/gpu/fp8.py sweeps alternatives on the GPU."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64 if k <= 64 else 128, GROUP_M=4, num_warps=4, num_stages=1)
    if m <= 16:
        return dict(BLOCK_M=16, BLOCK_N=32 if n <= 8192 else 64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=5)
    if m <= 64:
        return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4)
    if in_loop_scales:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4, TMA=True)
    if n <= 1024:
        return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=4)


def _tma_ok(x_q, w_q) -> bool:
    """Tensor descriptors take row-major operands with 16-byte aligned bases and row strides (Hopper and after;
    the interpreter emulates them)."""
    if not interpreting() and (x_q.device.type != "cuda" or _is_hip() or torch.cuda.get_device_capability(
            x_q.device) < (9, 0)):
        return False
    return all(t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (x_q, w_q))


def triton_fp8_linear(x_q, x_scale, w_q, w_scale, bias, out_dtype, config: dict | None = None):
    """fp8_linear on the Triton GEMM; ``config`` overrides :func:`gemm_config` (the benchmark's sweep)."""
    if config is not None and config.get("PREFETCH") and config.get("DEFER"):
        # Each is right alone; together they computed wrong products on the H200 (Triton 3.6, 2026-12-01: relative
        # error 0.21 at 4096^3 and 8192^3), though right under the interpreter and at the kit's small shapes.
        raise ValueError("fp8 GEMM config: PREFETCH and DEFER together give wrong results on Hopper; use one")
    (m, k), n = x_q.shape, w_q.shape[0]
    xl = scale_layout(x_scale, m, k, 1)
    wl = scale_layout(w_scale, n, k, SCALE_BLOCK)
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n) if bias is not None else torch.zeros_like(out))
    in_loop = BLOCK in (xl, wl)
    cfg = dict(config or gemm_config(m, n, k, in_loop))
    if in_loop:
        cfg["BLOCK_K"] = math.gcd(cfg["BLOCK_K"], SCALE_BLOCK)  # one scale block per K step
    xs2 = x_scale.reshape(1, 1) if xl == TENSOR else x_scale
    ws2 = w_scale.reshape(1, 1) if wl == TENSOR else w_scale
    i64 = max(m * x_q.stride(0), n * w_q.stride(0), m * out.stride(0), x_q.numel(), w_q.numel()) >= 2**31 - 1
    x_arg, w_arg = x_q, w_q
    if cfg.get("TMA"):
        if _tma_ok(x_q, w_q) and in_loop:
            from triton.tools.tensor_descriptor import TensorDescriptor

            x_arg = TensorDescriptor(x_q, [m, k], [x_q.stride(0), 1], [cfg["BLOCK_M"], cfg["BLOCK_K"]])
            w_arg = TensorDescriptor(w_q, [n, k], [w_q.stride(0), 1], [cfg["BLOCK_N"], cfg["BLOCK_K"]])
        else:
            cfg["TMA"] = False
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _fp8_gemm_kernel[grid](
        x_arg, w_arg, out, xs2, ws2, bias if bias is not None else out, m, n, k,
        x_q.stride(0), x_q.stride(1), w_q.stride(0), w_q.stride(1), out.stride(0), out.stride(1),
        xs2.stride(0), xs2.stride(1), ws2.stride(0), ws2.stride(1), bias.stride(0) if bias is not None else 0,
        X_MODE=xl, W_MODE=wl, IN_LOOP=in_loop,
        W_ONE=wl == BLOCK and SCALE_BLOCK % cfg["BLOCK_N"] == 0, HAS_BIAS=bias is not None, WIDEN=interpreting(),
        EVEN_K=k % cfg["BLOCK_K"] == 0, I64=i64, SB=SCALE_BLOCK, **cfg)
    return out


# ---------------------------------------------------------------------------------------------------------------
# fp8_quantize_per_token

ROW_BLOCK_MAX = 8192  # per-token rows up to this many elements are read once into registers; longer rows loop
GROUP_TILE = 4096  # elements per program in group mode (groups per program = GROUP_TILE // group width)
LOOP_BLOCK = 2048  # chunk of the two-pass loop over a long row


@triton.jit
def _quantize_values(x, s, QMAX: tl.constexpr, EMIN: tl.constexpr, NEG_ZERO: tl.constexpr):
    q = tl.math.div_rn(x, s)
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    return round_to_fp8_grid(q, EMIN, NEG_ZERO)


@triton.jit
def _quant_groups_kernel(x_ptr, q_ptr, s_ptr, K, NG, s_xm, s_xk, s_qm, s_sm,
                         GROUP: tl.constexpr, GPB: tl.constexpr, BLOCK_G: tl.constexpr,
                         QMAX: tl.constexpr, EMIN: tl.constexpr, NEG_ZERO: tl.constexpr):
    """Program (row, j) quantizes groups [j*GPB, (j+1)*GPB) of one row; a group is GROUP wide (the whole row for
    per-token scales). Tile [GPB, BLOCK_G]; one amax per tile row."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GPB + tl.arange(0, GPB)
    c = tl.arange(0, BLOCK_G)
    cols = g[:, None] * GROUP + c[None, :]
    mask = (c[None, :] < GROUP) & (cols < K) & (g[:, None] < NG)
    x = tl.load(x_ptr + row * s_xm + cols * s_xk, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    s = tl.math.div_rn(tl.maximum(amax, 1e-12), QMAX)
    q = _quantize_values(x, s[:, None], QMAX, EMIN, NEG_ZERO)
    tl.store(q_ptr + row * s_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * s_sm + g, s, mask=g < NG)


@triton.jit
def _quant_row_loop_kernel(x_ptr, q_ptr, s_ptr, K, s_xm, s_xk, s_qm,
                           BLOCK: tl.constexpr, QMAX: tl.constexpr, EMIN: tl.constexpr, NEG_ZERO: tl.constexpr):
    """One program per long row: pass 1 finds amax, pass 2 quantizes (the row comes from L2 the second time)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    xrow = x_ptr + row * s_xm
    amax_v = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(xrow + (k0 + offs) * s_xk, mask=k0 + offs < K, other=0.0).to(tl.float32)
        amax_v = tl.maximum(amax_v, tl.abs(x))
    s = tl.math.div_rn(tl.maximum(tl.max(amax_v, axis=0), 1e-12), QMAX)
    for k0 in range(0, K, BLOCK):
        m = k0 + offs < K
        x = tl.load(xrow + (k0 + offs) * s_xk, mask=m, other=0.0).to(tl.float32)
        q = _quantize_values(x, s, QMAX, EMIN, NEG_ZERO)
        tl.store(q_ptr + row * s_qm + k0 + offs, q.to(q_ptr.dtype.element_ty), mask=m)
    tl.store(s_ptr + row, s)


def triton_fp8_quantize(x: torch.Tensor, fp8_dtype: str, group_size: int):
    fp8 = FP8_DTYPES[fp8_dtype]
    m, k = x.shape
    q = torch.empty((m, k), dtype=fp8, device=x.device)
    s = torch.empty(scale_shape(m, k, group_size), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return q, s.fill_(1e-12 / torch.finfo(fp8).max) if s.numel() else s
    qmax, grid = float(torch.finfo(fp8).max), fp8_grid_params(fp8)
    group = group_size or k
    if group_size == 0 and k > ROW_BLOCK_MAX:
        _quant_row_loop_kernel[(m,)](x, q, s, k, x.stride(0), x.stride(1), q.stride(0),
                                     BLOCK=LOOP_BLOCK, QMAX=qmax, **grid, num_warps=8)
        return q, s
    block_g = triton.next_power_of_2(group)
    ng = s.shape[1]
    gpb = min(max(1, GROUP_TILE // block_g), triton.next_power_of_2(ng))
    warps = 4 if gpb * block_g <= 2048 else 8
    _quant_groups_kernel[(m, triton.cdiv(ng, gpb))](
        x, q, s, k, ng, x.stride(0), x.stride(1), q.stride(0), s.stride(0),
        GROUP=group, GPB=gpb, BLOCK_G=block_g, QMAX=qmax, **grid, num_warps=warps)
    return q, s


# ---------------------------------------------------------------------------------------------------------------
# registration


# torch's XPU build runs _scaled_mm through oneDNN (aten/src/ATen/native/mkldnn/xpu/ScaledBlas.cpp), tensor-wise and
# row-wise scales, from torch 2.10 on (before, "aten::_scaled_mm.out is not currently implemented for the XPU
# device"; intel/torch-xpu-ops#1550). Read from the sources, not run on Intel hardware here.
XPU_SCALED_MM_SINCE = (2, 10)


def xpu_scaled_mm_gate(torch_version: str, has_scaled_mm: bool) -> tuple[bool, str]:
    """Whether this torch runs fp8_linear's per-tensor / row-wise cases through ``torch._scaled_mm`` (oneDNN) on
    Intel GPUs, and why (pure, so the gate is tested on any machine)."""
    try:
        version = tuple(int(p) for p in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return False, f"torch version {torch_version!r} is not understood"
    since = ".".join(map(str, XPU_SCALED_MM_SINCE))
    if not has_scaled_mm or version < XPU_SCALED_MM_SINCE:
        return False, f"torch {torch_version} has no XPU torch._scaled_mm (oneDNN FP8 GEMM) yet: torch >= {since}"
    return True, (f"torch {torch_version}: torch._scaled_mm on XPU is oneDNN's FP8 GEMM (torch >= {since}); "
                  "not run on Intel hardware here")


def scaled_mm_supports_for(device_type: str, capability=None):
    """The ``supports`` of the ``scaled_mm`` implementation registered for ``device_type`` / ``capability``."""
    native = native_fp8_dtypes(device_type, capability)

    def supports(x_q, x_scale, w_q, w_scale, bias, out_dtype):
        if device_type not in ("cuda", "xpu"):
            return f"torch._scaled_mm runs on CUDA/HIP and XPU devices only, not {device_type}"
        if capability is not None and tuple(capability) < (8, 9):
            return f"torch._scaled_mm needs compute capability >= 8.9, this device is {tuple(capability)}"
        if not isinstance(x_q, torch.Tensor) or x_q.device.type != device_type:
            return f"tensors must be on {device_type}"
        if x_q.dtype not in native:
            return f"{x_q.dtype} is not this device's FP8 flavour ({[str(d) for d in native]})"
        return scaled_mm_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype)

    return supports


def _too_old(device_type: str, capability) -> bool:
    return device_type == "cuda" and capability is not None and tuple(capability) < (8, 9)


def _fp8_ok_for(native):
    def fp8_ok(dtype: torch.dtype) -> bool | str:
        if interpreting() or dtype in native:
            return True
        return f"{dtype} is not this device's FP8 flavour (its tensor cores take {[str(d) for d in native]})"

    return fp8_ok


def triton_supports_for(device_type: str, capability=None, lay_verdict=None):
    """The ``supports`` of a Triton fp8_linear kernel on ``device_type``: a well-formed call in the device's FP8
    flavour; ``lay_verdict(x_q, (x layout, w layout))`` adds the kernel's own conditions."""
    fp8_ok = _fp8_ok_for(native_fp8_dtypes(device_type, capability))

    def supports(x_q, x_scale, w_q, w_scale, bias, out_dtype):
        if _too_old(device_type, capability):
            return f"FP8 tensor cores need compute capability >= 8.9, this device is {tuple(capability)}"
        lay = _operands_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, device_type)
        if isinstance(lay, str):
            return lay
        ok = fp8_ok(x_q.dtype)
        return ok if ok is not True or lay_verdict is None else lay_verdict(x_q, lay)

    return supports


def register(registry, device_type: str, capability=None) -> None:
    """``scaled_mm`` (CUDA/HIP, and XPU where torch runs it through oneDNN), ``triton_fp8_gemm`` and ``triton_quant``
    for tensors on ``device_type``."""
    native = native_fp8_dtypes(device_type, capability)
    too_old = _too_old(device_type, capability)
    fp8_ok = _fp8_ok_for(native)
    gemm_supports = triton_supports_for(device_type, capability)

    def quant_supports(x, fp8_dtype, group_size):
        if not isinstance(x, torch.Tensor) or x.device.type != device_type:
            return f"x must be a tensor on {device_type}"
        if x.dtype not in X_DTYPES or x.dim() != 2:
            return f"x must be 2-D, one of {X_DTYPES}; got {x.dtype} {tuple(x.shape)}"
        if fp8_dtype not in FP8_DTYPES or not isinstance(group_size, int) or group_size < 0:
            return "fp8_dtype must be 'e4m3fn' or 'e4m3fnuz' and group_size >= 0"
        if group_size > ROW_BLOCK_MAX:
            return f"groups wider than {ROW_BLOCK_MAX} elements are not tiled"
        return fp8_ok(FP8_DTYPES[fp8_dtype])

    # What scaled_mm can claim where it runs: bf16 (row-wise and per-tensor) and, with e4m3fn, fp32 (the op's
    # fp32 conformance cases with K, N multiples of 16 are e4m3fn per-tensor ones). Where it cannot run it is
    # recorded as skipped, with the reason (a registration that can never run is an error).
    runs = device_type == "cuda" and not too_old and bool(native)
    note = "torch._scaled_mm: per-tensor (any output) and row-wise (bf16 output) scales"
    why_not = ("torch._scaled_mm needs a CUDA device with FP8 tensor cores (compute capability >= 8.9) or an XPU "
               f"torch >= 2.10; here: {device_type}, capability {capability}")
    if device_type == "xpu":
        runs, why = xpu_scaled_mm_gate(torch.__version__, hasattr(torch, "_scaled_mm"))
        note, why_not = f"{note}; {why}", why
    if runs:
        claims = (torch.bfloat16, torch.float32) if torch.float8_e4m3fn in native else (torch.bfloat16,)
        registry.register(fp8_linear, scaled_mm_linear, name="scaled_mm", supports=scaled_mm_supports_for(
                          device_type, capability), priority=SCALED_MM_PRIORITY, dtypes=claims, note=note)
    else:
        registry.skip(fp8_linear, "scaled_mm", why_not)
    # The Triton kernels run wherever an FP8 flavour is native (or interpreted); elsewhere they are skipped.
    if (native or interpreting()) and not too_old:
        registry.register(fp8_linear, triton_fp8_linear, name="triton_fp8_gemm", supports=gemm_supports,
                          priority=PRIORITY, note="Triton FP8 GEMM: per-tensor / per-row / 1x128 / 128x128 scales")
        registry.register(fp8_quantize_per_token, triton_fp8_quantize, name="triton_quant", supports=quant_supports,
                          priority=PRIORITY, note="Triton dynamic FP8 quantization, per token or per 1xG group")
    else:
        why = (f"FP8 tensor cores need compute capability >= 8.9, this device is {tuple(capability)}" if too_old
               else f"no native FP8 flavour on {device_type}")
        registry.skip(fp8_linear, "triton_fp8_gemm", why)
        registry.skip(fp8_quantize_per_token, "triton_quant", why)
