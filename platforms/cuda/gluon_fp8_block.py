"""Hopper FP8 GEMM with DeepSeek-style block scales, warp-specialized, in Gluon (``fp8_linear``: ``gluon_fp8_block``).

``out[M, N] = (x_q * x_scale) @ (w_q * w_scale)^T (+ bias)`` for e4m3fn operands with DeepSeek's block scales:
1x128 activation groups (``x_scale [M, K/128]``) and 128x128 weight blocks (``w_scale [ceil(N/128), K/128]``), or
one of them with a per-tensor scale (or per-token on x) on the other side; sm_90 only.

Why a separate kernel: with scales that vary along K, each 128-deep partial product must be scaled before it joins the
fp32 accumulator, so a single instruction stream waits for every wgmma (``wgmma.wait_group 0``) and the tensor cores
idle while it scales (BENCHMARKS.md, FP8 paragraphs). Here the roles are separate warps (``gl.warp_specialize``):

* a 1-warp loader issues TMA loads of each 128-deep step (two 64-row halves of the x tile, one 128-row w tile) into
  a ring of ``STAGES`` shared-memory stages, completing on a ``ready`` mbarrier per stage;
* two consumer warpgroups (the default partition and a 4-warp worker) each own one 64-row half of a 128x128 output
  tile. Each issues ``warpgroup_mma`` into a scratch accumulator, waits for it, frees the stage (``empty`` mbarrier,
  count 2: both halves read the w tile), and adds the product times ``x_scale[row] * w_scale`` to its fp32
  accumulator. The two warpgroups drift apart, so one's wait and scaling overlap the other's wgmma.

Measured (H200, Triton 3.6, 2026-12-01, benchmarks/gpu/fp8_gluon.py): 0.69-0.72x ``_scaled_mm`` per-tensor at
4096^3 and 0.74-0.76x at 8192^3 (the Triton GEMM: 0.69-0.70x / 0.67-0.69x): short of the 0.8x goal. Nsight Compute
at 8192^3 (before the scales moved behind the wgmma): tensor pipe 61.5% of peak, 12 warps an SM (registers and
shared memory allow one CTA), the consumers' samples mostly in the wgmma wait, then the scale loads. What did not
help: 4 or 6 stages, GROUP_M 16, one program per tile (8% slower), scales loaded a step ahead through loop-carried
registers (5-15% slower), and two steps' wgmmas in flight per warpgroup (no better).
A lead, not measured: each warpgroup's m64n128 wgmma reads the whole w tile
from shared memory, so shared-memory traffic per FLOP is about 1.25x that of 128x256 tiles; a 64x256 half-tile
needs 256 registers per thread for its fp32 accumulator and scratch product (ptxas gave this kernel 168).

The grid is persistent when ``PERSISTENT`` (one program per multiprocessor walking tiles in grouped order, so
``GROUP_M`` row tiles share a weight tile while it is in L2), else one program per tile.

Triton versions: the GPU image has Triton 3.6, torch 2.13 brings 3.9. Gluon's TMA load is
``tma.async_copy_global_to_shared`` in 3.6 and ``tma.async_load`` in 3.9 (the old name raises there): picked by
feature detection below. Everything else used here has the same spelling in both.
"""

from __future__ import annotations

import math

import torch

from engine.core.ops.fp8 import BLOCK_K as SCALE_BLOCK
from engine.core.ops.fp8 import fp8_linear

GLUON_PRIORITY = 15  # above triton_fp8_gemm (10); below scaled_mm (20), which never takes block scales

try:  # no Triton, or a Triton without Gluon or its Hopper module: the op falls through to the Triton GEMM
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from engine.platforms.triton_kernels.fp8_linear import (
        BLOCK,
        PRIORITY,
        ROW,
        SCALED_MM_PRIORITY,
        TENSOR,
        _operands_verdict,
        scale_layout,
    )

    assert PRIORITY < GLUON_PRIORITY < SCALED_MM_PRIORITY
    # Triton 3.9 renamed the TMA load (3.6: async_copy_global_to_shared; same positional arguments)
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    GLUON_MISSING = None
    _jit = gluon.jit
except Exception as exc:  # noqa: BLE001 - any failure to import means: no Gluon here
    GLUON_MISSING = f"Gluon (triton.experimental.gluon with its Hopper TMA / wgmma / mbarrier) is not importable: " \
                    f"{type(exc).__name__}: {exc}"
    gl = None

    def _jit(fn):
        return fn

HALF = 64  # rows per consumer warpgroup (one m64 wgmma)
BM = 2 * HALF  # output tile: 128 x 128, one weight scale block wide
BN = SCALE_BLOCK
BK = SCALE_BLOCK  # one K step per scale block
CONFIG = dict(STAGES=5, GROUP_M=8, PERSISTENT=True)  # the default; benchmarks/gpu/fp8_gluon.py sweeps others
# Below 4096 rows or 1024 output tiles of 128x128 the portable Triton GEMM (smaller tiles, more programs) is as fast
# or faster. H200, Triton 3.6, 2026-12-01, this kernel against triton_fp8_gemm: 1.01x at 4096^3 (1024 tiles), 1.09x
# to 1.13x at 8192^3, 1.06x at 8192x4096x4096, 1.00x at 2048x4096x4096, 0.98x at 1024x4096x4096, 0.57x at
# 64x4096x4096 (graph replays below 4096^3): supports() leaves the smaller calls to it.
MIN_M, MIN_TILES = 4096, 1024
CONSUMER_REGS, LOADER_REGS, MAXNREG = 232, 40, 168  # 2 x 232 + 40 <= 3 warpgroups x 168 registers per thread


@_jit
def _tile(t, num_m, num_n, GROUP_M: gl.constexpr):
    """Tile t's (row tile, column tile) in grouped order: GROUP_M row tiles walk the column tiles together."""
    width = GROUP_M * num_n
    first_m = (t // width) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (t % width) % rows, (t % width) // rows


@_jit
def _loader(x_desc, w_desc, a_bufs, b_bufs, ready, empty, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K,
            s_om, s_xsm, s_xsk, s_wsn, s_wsk, half: gl.constexpr, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr,
            GROUP_M: gl.constexpr, acc_layout: gl.constexpr, ALIGNED: gl.constexpr):
    num_m = gl.cdiv(M, 2 * x_desc.block_type.shape[0])
    num_n = gl.cdiv(N, w_desc.block_type.shape[0])
    nk = gl.cdiv(K, x_desc.block_type.shape[1])  # a partial last step is zero-filled
    nbytes: gl.constexpr = 2 * x_desc.block_type.nbytes + w_desc.block_type.nbytes
    it = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_m, num_n, GROUP_M)
        for kk in range(nk):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)  # rows past M / N come zero-filled and still count
            k0 = kk * x_desc.block_type.shape[1]
            _tma_load(x_desc, [pid_m * 2 * x_desc.block_type.shape[0], k0], bar, a_bufs.index(2 * s))
            _tma_load(x_desc, [(pid_m * 2 + 1) * x_desc.block_type.shape[0], k0], bar, a_bufs.index(2 * s + 1))
            _tma_load(w_desc, [pid_n * w_desc.block_type.shape[0], k0], bar, b_bufs.index(s))
            it += 1


@_jit
def _consumer(x_desc, w_desc, a_bufs, b_bufs, ready, empty, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K,
              s_om, s_xsm, s_xsk, s_wsn, s_wsk, half: gl.constexpr, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, acc_layout: gl.constexpr, ALIGNED: gl.constexpr):
    """Rows [half*64, half*64 + 64) of each tile: wgmma per K step, wait, free the stage, scale-accumulate."""
    H: gl.constexpr = x_desc.block_type.shape[0]
    TN: gl.constexpr = w_desc.block_type.shape[0]
    num_m = gl.cdiv(M, 2 * H)
    num_n = gl.cdiv(N, TN)
    nk = gl.cdiv(K, x_desc.block_type.shape[1])  # a partial last step is zero-filled
    zero = gl.zeros([H, TN], gl.float32, acc_layout)
    it = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, num_m, num_n, GROUP_M)
        rows = pid_m * 2 * H + half * H + gl.arange(0, H, layout=gl.SliceLayout(1, acc_layout))
        rmask = rows < M
        xs_row = xs_ptr + rows * s_xsm
        ws_col = ws_ptr + pid_n * s_wsn  # TN == 128: one weight block per tile and step
        acc = gl.zeros([H, TN], gl.float32, acc_layout)
        for kk in range(nk):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            part = warpgroup_mma(a_bufs.index(2 * s + half), b_bufs.index(s).permute((1, 0)), zero,
                                 use_acc=False, is_async=True)
            # the scales load behind the wgmma's issue. Loaded before the stage wait (as first written), ptxas
            # hoisted their product sx * sw above the wgmma, so the tensor cores waited for two global loads each
            # step (ncu: the top stall of the consumers after the wgmma wait itself); 0.69x -> 0.74-0.75x at 8192^3.
            sx = gl.load(xs_row + kk * s_xsk, mask=rmask, other=0.0)
            sw = gl.load(ws_col + kk * s_wsk)
            part = warpgroup_mma_wait(0, deps=[part])
            mbarrier.arrive(empty.index(s), count=1)
            acc = part * (sx * sw)[:, None] + acc
            it += 1
        if ALIGNED:  # partition arguments lose the launcher's divisibility facts: restate them (exact values)
            N = (N // 16) * 16
            s_om = (s_om // 16) * 16
        cols = pid_n * TN + gl.arange(0, TN, layout=gl.SliceLayout(0, acc_layout))
        if HAS_BIAS:
            acc = acc + gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
        optrs = out_ptr + rows.to(gl.int64)[:, None] * s_om + cols[None, :]
        if ALIGNED:  # and the base's alignment, so that each thread's column pair is one store
            optrs = gl.multiple_of(optrs, [16, 16])
        gl.store(optrs, acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & (cols < N)[None, :])


@_jit
def _fp8_block_gemm_kernel(x_desc, w_desc, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K,
                           s_om, s_xsm, s_xsk, s_wsn, s_wsk, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr,
                           GROUP_M: gl.constexpr, ALIGNED: gl.constexpr, LOADER_REGS: gl.constexpr,
                           CONSUMER_REGS: gl.constexpr):
    """out = x @ w^T with per-step scales; x_desc boxes [64, 128], w_desc boxes [128, 128]; K % 16 == 0 (the
    last step's columns past K come zero-filled from both operands)."""
    TN: gl.constexpr = w_desc.block_type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, TN, 32])
    a_bufs = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES] + x_desc.block_type.shape, x_desc.layout)
    b_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumer warpgroups release each stage
    # scalars the launcher specialized to constants (a stride of 1) are Python ints: partitions take tensors
    M = gl.to_tensor(M)
    N = gl.to_tensor(N)
    K = gl.to_tensor(K)
    s_om = gl.to_tensor(s_om)
    s_xsm = gl.to_tensor(s_xsm)
    s_xsk = gl.to_tensor(s_xsk)
    s_wsn = gl.to_tensor(s_wsn)
    s_wsk = gl.to_tensor(s_wsk)
    gl.warp_specialize([  # the default partition runs in the kernel's num_warps (4): the first consumer
        (_consumer, (x_desc, w_desc, a_bufs, b_bufs, ready, empty, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K, s_om,
                     s_xsm, s_xsk, s_wsn, s_wsk, 0, HAS_BIAS, STAGES, GROUP_M, acc_layout, ALIGNED)),
        (_consumer, (x_desc, w_desc, a_bufs, b_bufs, ready, empty, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K, s_om,
                     s_xsm, s_xsk, s_wsn, s_wsk, 1, HAS_BIAS, STAGES, GROUP_M, acc_layout, ALIGNED)),
        (_loader, (x_desc, w_desc, a_bufs, b_bufs, ready, empty, out_ptr, xs_ptr, ws_ptr, bias_ptr, M, N, K, s_om,
                   s_xsm, s_xsk, s_wsn, s_wsk, 1, HAS_BIAS, STAGES, GROUP_M, acc_layout, ALIGNED)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))


# ---------------------------------------------------------------------------------------------------------------
# host side


def _descriptors(x_q, w_q):
    a_layout = gl.NVMMASharedLayout.get_default_for([HALF, BK], gl.float8e4nv)
    b_layout = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.float8e4nv)
    return (TensorDescriptor.from_tensor(x_q, [HALF, BK], a_layout),
            TensorDescriptor.from_tensor(w_q, [BN, BK], b_layout))


def gluon_fp8_block_linear(x_q, x_scale, w_q, w_scale, bias, out_dtype, config: dict | None = None):
    """fp8_linear for calls :func:`supports` accepts; ``config`` overrides :data:`CONFIG` (the benchmark's sweep)."""
    cfg = {**CONFIG, **(config or {})}
    (m, k), n = x_q.shape, w_q.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0:
        return out
    x_desc, w_desc = _descriptors(x_q, w_q)
    bias = bias.contiguous() if bias is not None else None
    tiles = math.ceil(m / BM) * math.ceil(n / BN)
    grid = min(tiles, _sms(x_q.device)) if cfg["PERSISTENT"] else tiles
    # a scale that does not vary along a dimension is read through stride 0 there (one kernel for every pairing)
    xl, wl = scale_layout(x_scale, m, k, 1), scale_layout(w_scale, n, k, SCALE_BLOCK)
    xs, ws = x_scale.reshape(x_scale.shape[0] if xl != TENSOR else 1, -1), w_scale.reshape(1, 1) if wl == TENSOR \
        else w_scale
    s_xsm, s_xsk = (0 if xl == TENSOR else xs.stride(0)), (xs.stride(1) if xl == BLOCK else 0)
    s_wsn, s_wsk = (0, 0) if wl == TENSOR else (ws.stride(0), ws.stride(1))
    _fp8_block_gemm_kernel[(grid,)](
        x_desc, w_desc, out, xs, ws, bias if bias is not None else out, m, n, k,
        out.stride(0), s_xsm, s_xsk, s_wsn, s_wsk,
        HAS_BIAS=bias is not None, ALIGNED=n % 16 == 0 and out.data_ptr() % 16 == 0, STAGES=cfg["STAGES"],
        GROUP_M=cfg["GROUP_M"], LOADER_REGS=LOADER_REGS, CONSUMER_REGS=CONSUMER_REGS,
        num_warps=4, maxnreg=MAXNREG)
    return out


def compile_for_sm90(out_dtype=torch.bfloat16, has_bias=False, stages=None):
    """The kernel compiled for sm_90 with the installed Triton, no GPU needed (``triton.compile`` with an explicit
    target); ``.asm`` holds its ttgir / ptx / cubin. For CI and for reading the SASS before spending device time.
    Under Triton's interpreter the compile runs in a fresh process without it (see ``gluon_compile``) and what comes
    back carries ``.asm`` and ``.metadata`` only."""
    from engine.platforms.cuda.gluon_compile import compile_outside_interpreter, interpreter_on

    if interpreter_on():
        return compile_outside_interpreter(__name__, "compile_for_sm90",
                                           dict(out_dtype=out_dtype, has_bias=has_bias, stages=stages))
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    m, n, k = 256, 256, 512
    x = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    w = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    out = torch.empty(m, n, dtype=out_dtype)
    xs = torch.empty(m, k // BK)
    x_desc, w_desc = _descriptors(x, w)
    args = dict(x_desc=x_desc, w_desc=w_desc, out_ptr=out, xs_ptr=xs, ws_ptr=xs, bias_ptr=out, M=m, N=n, K=k,
                s_om=n, s_xsm=xs.stride(0), s_xsk=1, s_wsn=xs.stride(0), s_wsk=1)
    consts = dict(HAS_BIAS=has_bias, STAGES=stages or CONFIG["STAGES"], GROUP_M=CONFIG["GROUP_M"], ALIGNED=True,
                  LOADER_REGS=LOADER_REGS, CONSUMER_REGS=CONSUMER_REGS)
    fn = _fp8_block_gemm_kernel
    sig = {a: "constexpr" if a in consts else mangle_type(args[a]) for a in fn.arg_names}
    src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(a),): v for a, v in consts.items()}, attrs={})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=MAXNREG))


def _sms(device) -> int:
    from engine.platforms.triton_kernels import sm_count

    return sm_count(device, 1)


# ---------------------------------------------------------------------------------------------------------------
# gate and registration


def _aligned(t: torch.Tensor) -> bool:
    """TMA: row-major, 16-byte aligned base and row stride."""
    return t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0


def operands_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, device_type: str = "cuda") -> bool | str:
    """True when the kernel computes this call on tensors of ``device_type`` (the platform checks aside): a block
    scale on x (1x128 groups) or w (128x128 blocks), the other side per-tensor, per-row for x (a shape that reads as
    both, e.g. x_scale [M, 1] with K <= 128, is the same scaling), or block; e4m3fn; K % 16 == 0 (TMA row
    stride; a partial last K step is zero-filled); row-major 16-byte aligned operands; M and N any. Else the reason."""
    lay = _operands_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, device_type)
    if isinstance(lay, str):
        return lay
    if BLOCK not in lay or lay[1] == ROW:
        return ("block scales on x or w, none per-channel on w (a 128-column tile takes one w scale per step); "
                "others: triton_fp8_gemm / scaled_mm")
    if x_q.dtype != torch.float8_e4m3fn:
        return f"e4m3fn operands only, not {x_q.dtype}"
    k = x_q.shape[1]
    if k == 0 or k % 16:
        return f"K must be a positive multiple of 16 (TMA row stride), got {k}"
    if not (_aligned(x_q) and _aligned(w_q)):
        return "x_q and w_q must be row-major with 16-byte aligned base and row stride (TMA)"
    return True


def platform_verdict(device_type: str, capability, gluon_missing: str | None) -> str | None:
    """Why the kernel cannot run on this platform (None: it can): CUDA (not HIP), compute capability (9, 0) (its
    wgmma and register reallocation are sm_90a; Blackwell has other tensor-core instructions), Gluon importable."""
    if device_type != "cuda" or getattr(torch.version, "hip", None) is not None:
        return "the Gluon FP8 block GEMM is NVIDIA Hopper code (CUDA, not HIP)"
    if capability is None or tuple(capability) != (9, 0):
        return f"the Gluon FP8 block GEMM is built for compute capability (9, 0) only, not {capability}"
    return gluon_missing or None


def size_verdict(m: int, n: int) -> bool | str:
    """True when an [m, n] output has at least :data:`MIN_M` rows and :data:`MIN_TILES` 128x128 tiles, else why it
    is left to Triton."""
    tiles = math.ceil(m / BM) * math.ceil(n / BN)
    if m < MIN_M:
        return f"M = {m} < {MIN_M}: the Triton GEMM is as fast or faster there"
    if tiles < MIN_TILES:
        return f"{tiles} output tiles of 128x128 < {MIN_TILES}: the Triton GEMM is as fast or faster there"
    return True


def supports_for(device_type: str, capability, gluon_missing: str | None):
    """The ``supports`` of ``gluon_fp8_block``: :func:`platform_verdict`, :func:`operands_verdict`, then
    :func:`size_verdict`. What it declines goes to ``triton_fp8_gemm``."""

    def supports(x_q, x_scale, w_q, w_scale, bias, out_dtype):
        why = platform_verdict(device_type, capability, gluon_missing)
        if why:
            return why
        ok = operands_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, device_type)
        return size_verdict(x_q.shape[0], w_q.shape[0]) if ok is True else ok

    return supports


def register(registry, device_type: str, capability=None) -> None:
    """``gluon_fp8_block`` for ``fp8_linear`` (priority between triton_fp8_gemm and scaled_mm) on an sm_90 CUDA
    device with Gluon; elsewhere recorded as skipped with the reason (``engine doctor`` shows it)."""
    why = platform_verdict(device_type, capability, GLUON_MISSING)
    if why:
        registry.skip(fp8_linear, "gluon_fp8_block", why)
        return
    # It claims bf16 (the GPU models' dtype): the conformance kit's accelerator budget draws a 4096 x 4096 block-scaled
    # case (fp8_linear's draw_large_block) that it takes; tests/platforms/cuda/test_gluon_fp8_block.py checks the
    # kernel itself at every shape and dtype.
    registry.register(fp8_linear, gluon_fp8_block_linear, name="gluon_fp8_block",
                      supports=supports_for(device_type, capability, None), priority=GLUON_PRIORITY,
                      dtypes=(torch.bfloat16,),
                      note="Gluon warp-specialized Hopper FP8 GEMM: block scales on x and/or w, large M x N")
