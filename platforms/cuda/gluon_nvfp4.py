"""NVFP4 W4A16 ``nvfp4_linear`` for 2..16 rows of bf16 / fp16 x on tensor cores with register operands (Gluon; sm_90).

``mma.sync`` m16n8k16 with the weight as the A operand and x^T (M padded to 8 or 16 columns) as B, fp32
accumulation ("swap AB"). The weight never goes through shared memory: each thread loads exactly the packed bytes of
its A fragments and decodes them in registers (no FMA per weight value; the decode is ~2.6 SASS instructions per
value, the whole loop ~3.5 at M <= 8, read from sm_90 SASS on a CPU host). The stored weight is used as it is: no
re-ordered copy, no extra memory.

Fragment plan. A K step is 64 * KS values; lane (g, t) of a warp (g = lane / 4, t = lane % 4) loads blocks
t * KS .. t * KS + KS - 1 of rows g and g + 8 of each 16-row tile (their int32 words, contiguous: one 8 * KS-byte
load a row) and their scales. The order of the terms of a dot product is free, so the K slots of a step's
m16n8k16 instructions are assigned to suit the decode: instruction (s, j) gets, from lane t, the pair (element j,
element j + 4) of word 0 of block s as a0a1 and of word 1 as a4a5, which is exactly the 32-bit register the scaled
decode of ``platforms/triton_kernels/nvfp4.py`` (``_asm_decode_text``: codes i and i + 4 -> one 16-bit pair, times
the block scale) produces. In Gluon terms the decoded planes are joined / permuted / reshaped into the logical
[.., 64KS-slot] tile whose layout is the ``DotOperandLayout`` of an ``NVMMADistributedLayout`` version [2, 0], so
the ``convert_layout`` to it moves nothing. x is loaded as the 16KS contiguous values of a lane's blocks (int32
pairs, 16-byte loads) and permuted the same way (slot 64s + 16j + 8w + 2t + e holds element 16(t KS + s) + 8w + j + 4e
of the step); that conversion stays inside each thread (pairs rebuilt by ``prmt``).

A CTA owns 16 * R rows; its W warps take interleaved K steps (a batched, rank-3 MMA: the warp is the batch axis) and
their partial tiles are summed once at the end through shared memory; the grid is (row blocks, K splits), split-K
partials (fp32, already scaled) summed by the Triton module's ``splitk_reduce`` (small N only). The next round's
words, scales and x are loaded before the current round's decode and MMAs (a register double buffer). Scaling: bf16
codes are ``e2m1 * 2**-126`` and the scale ``scale * 2**116``; fp16 codes ``e2m1 * 2**-14`` and ``scale * 2**7``
(exact, see ``_asm_scale_factor`` there); the accumulator is multiplied by 2**10 / 2**7 and 1 / global scale at the
end. The bf16 decode's ``mul.bf16x2`` needs sm_90 (fp16 builds for sm_80; not enabled there: not measured).
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from engine.core.ops.nvfp4 import nvfp4_linear

PRIORITY = 15  # above the portable Triton kernels (10), below a native FP4 path (20)
MAX_M = 16
K_STEP = 64  # values of K per step: four 16-value blocks, one per lane of a quad
X_DTYPES = (torch.bfloat16, torch.float16)
MIN_CAPABILITY = (8, 0)  # mma.sync m16n8k16 with bf16 / fp16 operands (Ampere and later)

# Tile (H200 sweeps, 2026-12-01, benchmarks/gpu/nvfp4_gluon.py): 16-value blocks per lane per K step (K_STEP * KS
# values) and K steps loaded ahead (2 cost registers and lost: 26.3 vs 18.2 us). The kernel is latency-bound: a warp
# issues its decode chain alone, so what counts is warps per SM. M <= 8 (~128 registers a thread): 2 row tiles a
# CTA and warps (each a slice of K) doubled from MIN_WARPS up to 16 while the grid stays within WARPS_PER_SM warps an
# SM (4096x14336: 128 CTAs x 16 warps, 18.2 us; 4 warps: 28.8; 14336x4096: 448 CTAs x 4 warps, 16.6 us; 8 warps:
# 20.5). M > 8 (~166 registers at 2 row tiles, ~208 at 4: 8 warps an SM): 2 row tiles x 8 warps when N / 32 CTAs fit
# the SMs once (4096x14336: 25.1 us; 4 x 4: 28.7), else 4 row tiles x 4 warps (14336x4096: 22.4 us; 2 x 8: 38.1).
# K is split across CTAs too (a second launch sums them, ~3 us) only when the grid has under an eighth of the warps.
KS = 2
DEPTH = 1
WARPS_PER_SM = 16
MIN_WARPS = 4


def gluon_status() -> tuple[bool, str]:
    """Whether Triton's Gluon with everything this module uses imports here. (ok, reason)."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    try:
        import triton.experimental.gluon.language as gl
        from triton.experimental import gluon  # noqa: F401
        from triton.experimental.gluon.language.nvidia import ampere
    except Exception as exc:  # an older Triton without Gluon, or a broken install
        return False, f"triton.experimental.gluon unavailable: {type(exc).__name__}: {exc}"
    need = ("DistributedLinearLayout", "NVMMADistributedLayout", "DotOperandLayout", "SliceLayout", "join",
            "permute", "reshape", "inline_asm_elementwise", "convert_layout")
    missing = [n for n in need if not hasattr(gl, n)] + ([] if hasattr(ampere, "mma_v2") else ["ampere.mma_v2"])
    if missing:
        return False, f"triton {_triton_version()} Gluon lacks {', '.join(missing)}"
    return True, f"triton {_triton_version()} Gluon"


def _triton_version() -> str:
    import triton

    return triton.__version__


@functools.cache
def _kernels():
    """The Gluon kernel, built on first use (Triton imported only then)."""
    import triton.experimental.gluon.language as gl
    from triton.experimental import gluon
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2

    from engine.platforms.triton_kernels.nvfp4 import _asm_decode_text

    asm_bf16 = gl.constexpr(_asm_decode_text(True))
    asm_f16 = gl.constexpr(_asm_decode_text(False))

    @gluon.jit
    def _decode(w, s16, BF16: gl.constexpr):
        """int32 words [BN, 4, 2] and 16-bit scales (broadcast) -> the 8 element planes, scaled, in x's dtype."""
        if BF16:
            return gl.inline_asm_elementwise(asm_bf16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                                             dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            return gl.inline_asm_elementwise(asm_f16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                                             dtype=(gl.float16,) * 8, is_pure=True, pack=1)

    @gluon.jit
    def _a_tile(w, sb, W: gl.constexpr, BN: gl.constexpr, KS: gl.constexpr, BF16: gl.constexpr,
                W_LAYOUT: gl.constexpr, A_LAYOUT: gl.constexpr):
        """Words [W, BN, 4 (lane t), 2KS (block s, word)] and scale bytes [W, BN, 4, KS] of one K step -> the A
        operand [W, BN, 64KS] (slot 64s + 16j + 8w + 2t + e holds element j + 4e of word w of block s of lane t)."""
        s = ((sb.to(gl.int32) << 20) & 0x07F00000).to(gl.float32, bitcast=True) * 1.329227995784916e36  # the scale
        if BF16:
            s16 = (s * 8.307674973655724e34).to(gl.bfloat16)  # scale * 2**116
        else:
            s16 = (s * 128.0).to(gl.float16)  # scale * 2**7
        s16 = gl.convert_layout(gl.reshape(gl.join(s16, s16), (W, BN, 4, 2 * KS)), W_LAYOUT)  # one per word
        p0, p1, p2, p3, p4, p5, p6, p7 = _decode(w, s16, BF16)
        # join appends the new axis last: join(join(a, b), join(c, d))[..., i, j] is (a, b, c, d)[i + 2j]
        q0 = gl.join(gl.join(p0, p1), gl.join(p2, p3))  # [W, BN, t, u, j0, j1]: element j of each word
        q1 = gl.join(gl.join(p4, p5), gl.join(p6, p7))  # element j + 4
        q = gl.reshape(gl.join(q0, q1), (W, BN, 4, KS, 2, 2, 2, 2))  # [W, BN, t, s, w, j0, j1, e]
        q = gl.permute(q, (0, 1, 3, 6, 5, 4, 2, 7))  # [W, BN, s, j1, j0, w, t, e]
        return gl.convert_layout(gl.reshape(q, (W, BN, 64 * KS)), A_LAYOUT)

    @gluon.jit
    def _b_tile(xw, W: gl.constexpr, NP: gl.constexpr, KS: gl.constexpr, BF16: gl.constexpr,
                B_LAYOUT: gl.constexpr):
        """x as int32 pairs [W, NP, 4 (t), 8KS] of one K step -> the B operand [W, 64KS slots, NP]. (x travels
        through the register ring as int32: 16-bit elements there cost a repacking per step.)"""
        if BF16:
            lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [xw],
                                               dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)
        else:
            lo, hi = gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [xw],
                                               dtype=(gl.float16, gl.float16), is_pure=True, pack=1)
        xv = gl.reshape(gl.join(lo, hi), (W, NP, 4, 16 * KS))  # element 16s + 8w + 4e + j of lane t's blocks
        q = gl.reshape(xv, (W, NP, 4, KS, 2, 2, 2, 2))  # [W, n, t, s, w, e, j1, j0]
        q = gl.permute(q, (0, 3, 6, 7, 4, 2, 5, 1))  # [W, s, j1, j0, w, t, e, n]
        return gl.convert_layout(gl.reshape(q, (W, 64 * KS, NP)), B_LAYOUT)

    @gluon.jit
    def _load_step(w_ptrs, s_ptrs, x_ptrs, wkw, skw, xkw, base, k_end, W: gl.constexpr, KS: gl.constexpr,
                   EVEN: gl.constexpr):
        """Words, scale bytes and x of the round starting at step ``base`` (warp kw: step base + kw). EVEN (every
        round of the split is whole): a round past the end reloads the last one (in bounds, unused), no masks;
        else steps past ``k_end`` load zeros."""
        if EVEN:
            b = gl.minimum(base, k_end - W)
            return gl.load(w_ptrs + b * (8 * KS)), gl.load(s_ptrs + b * (4 * KS)), gl.load(x_ptrs + b * (32 * KS))
        else:
            return (gl.load(w_ptrs + base * (8 * KS), mask=wkw + base < k_end, other=0),
                    gl.load(s_ptrs + base * (4 * KS), mask=skw + base < k_end, other=0),
                    gl.load(x_ptrs + base * (32 * KS), mask=xkw + base < k_end, other=0))

    @gluon.jit
    def w4a16_mma_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, out_ptr, part_ptr, M, N, stride_xm, stride_wn,
                         stride_sn, stride_om, steps_per_split, steps,
                         HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, BF16: gl.constexpr, NP: gl.constexpr,
                         BN: gl.constexpr, W: gl.constexpr, KS: gl.constexpr, DEPTH: gl.constexpr, EVEN: gl.constexpr,
                         W_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, X_LAYOUT: gl.constexpr,
                         MMA_LAYOUT: gl.constexpr):
        """out^T tile [BN, NP] = W [BN, K] @ x^T for the rows pid_n * BN .. and K split pid_k (see the module
        docstring); warp kw of the CTA takes steps kw, kw + W, .. of the split, the W partial tiles are summed at the
        end. w_ptr: the packed weight as int32 words [N, K/8]; s_ptr: scale bytes [N, K/16]; a step is 64KS values
        (K % 64KS == 0). DEPTH: rounds loaded ahead of the one computed (1 or 2). EVEN: steps and steps_per_split
        are multiples of W."""
        A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_LAYOUT, k_width=2)
        B_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA_LAYOUT, k_width=2)
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        # words [W, BN, t, u] (u = 2s + word) and scales [W, BN, t, s]; rows past N read row N - 1 (never stored)
        WL3: gl.constexpr = gl.SliceLayout(3, W_LAYOUT)
        kw = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL3)))
        r = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL3)))
        t = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL3)))
        u = gl.arange(0, 2 * KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, W_LAYOUT))))
        rows = gl.minimum(pid_n * BN + r, N - 1).to(gl.int64)
        w_off3 = (gl.expand_dims(gl.expand_dims(kw * (8 * KS), 1) + gl.expand_dims(rows * stride_wn, 0), 2)
                  + gl.expand_dims(gl.expand_dims(t * (2 * KS), 0), 1))
        w_ptrs = w_ptr + (gl.expand_dims(w_off3, 3) + gl.expand_dims(gl.expand_dims(gl.expand_dims(u, 0), 1), 2))
        SL3: gl.constexpr = gl.SliceLayout(3, S_LAYOUT)
        skw = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL3)))
        sr = gl.arange(0, BN, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL3)))
        st = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL3)))
        ss = gl.arange(0, KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, S_LAYOUT))))
        srows = gl.minimum(pid_n * BN + sr, N - 1).to(gl.int64)
        s_off3 = (gl.expand_dims(gl.expand_dims(skw * (4 * KS), 1) + gl.expand_dims(srows * stride_sn, 0), 2)
                  + gl.expand_dims(gl.expand_dims(st * KS, 0), 1))
        s_ptrs = s_ptr + (gl.expand_dims(s_off3, 3) + gl.expand_dims(gl.expand_dims(gl.expand_dims(ss, 0), 1), 2))
        # x as int32 pairs [W, n, t, 8KS]: columns past M read row M - 1 (never stored); stride_xm is even
        x32 = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
        XL3: gl.constexpr = gl.SliceLayout(3, X_LAYOUT)
        xkw = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, XL3)))
        xn = gl.minimum(gl.arange(0, NP, layout=gl.SliceLayout(0, gl.SliceLayout(2, XL3))), M - 1)
        xt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, XL3)))
        xq = gl.arange(0, 8 * KS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, X_LAYOUT))))
        x_off3 = (gl.expand_dims(gl.expand_dims(xkw * (32 * KS), 1)
                                 + gl.expand_dims(xn.to(gl.int64) * (stride_xm // 2), 0), 2)
                  + gl.expand_dims(gl.expand_dims(xt * (8 * KS), 0), 1))
        x_ptrs = x32 + (gl.expand_dims(x_off3, 3) + gl.expand_dims(gl.expand_dims(gl.expand_dims(xq, 0), 1), 2))
        # step validity per warp (the split's last round may not cover every warp): masked loads give zero words
        wmask0 = gl.expand_dims(gl.expand_dims(gl.expand_dims(kw, 1), 2), 3)
        smask0 = gl.expand_dims(gl.expand_dims(gl.expand_dims(skw, 1), 2), 3)
        xmask0 = gl.expand_dims(gl.expand_dims(gl.expand_dims(xkw, 1), 2), 3)

        k_begin = pid_k * steps_per_split
        k_end = gl.minimum(k_begin + steps_per_split, steps)
        acc = gl.zeros([W, BN, NP], gl.float32, MMA_LAYOUT)
        # register ring: the steps DEPTH rounds ahead are loaded before this round's decode and MMAs
        w0, s0, x0 = _load_step(w_ptrs, s_ptrs, x_ptrs, wmask0, smask0, xmask0, k_begin, k_end, W, KS, EVEN)
        if DEPTH == 2:
            w1, s1, x1 = _load_step(w_ptrs, s_ptrs, x_ptrs, wmask0, smask0, xmask0, k_begin + W, k_end, W, KS,
                                    EVEN)
        for i in range(k_begin, k_end, W):
            wn, sn, xn_ = _load_step(w_ptrs, s_ptrs, x_ptrs, wmask0, smask0, xmask0, i + DEPTH * W, k_end, W, KS,
                                     EVEN)
            a = _a_tile(w0, s0, W, BN, KS, BF16, W_LAYOUT, A_LAYOUT)
            acc = mma_v2(a, _b_tile(x0, W, NP, KS, BF16, B_LAYOUT), acc)
            if DEPTH == 2:
                w0 = w1
                s0 = s1
                x0 = x1
                w1 = wn
                s1 = sn
                x1 = xn_
            else:
                w0 = wn
                s0 = sn
                x0 = xn_

        OUT_LAYOUT: gl.constexpr = gl.SliceLayout(0, MMA_LAYOUT)
        if BF16:
            f = gl.div_rn(1024.0, gl.load(gs_ptr))  # undo codes * scale's 2**-10, divide by the global scale
        else:
            f = gl.div_rn(128.0, gl.load(gs_ptr))
        res = gl.sum(acc, axis=0) * f  # the W warps' partial sums (through shared memory, once)
        orow = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, OUT_LAYOUT))
        ocol = gl.arange(0, NP, layout=gl.SliceLayout(0, OUT_LAYOUT))
        omask = gl.expand_dims(orow < N, 1) & gl.expand_dims(ocol < M, 0)
        if SPLIT:
            off = gl.expand_dims((pid_k * M + ocol).to(gl.int64) * N, 0) + gl.expand_dims(orow, 1)
            gl.store(part_ptr + off, res, mask=omask)
        else:
            if HAS_BIAS:
                bias = gl.load(bias_ptr + orow, mask=orow < N, other=0.0).to(gl.float32)
                res = res + gl.expand_dims(bias, 1)
            off = gl.expand_dims(ocol.to(gl.int64) * stride_om, 0) + gl.expand_dims(orow, 1)
            gl.store(out_ptr + off, res.to(out_ptr.dtype.element_ty), mask=omask)

    return w4a16_mma_kernel


def _log2(v: int) -> int:
    assert v > 0 and v & (v - 1) == 0, v
    return v.bit_length() - 1


def layouts(np_cols: int, row_tiles: int = 2, warps: int = 4, ks: int = KS) -> dict:
    """The explicit layouts (Gluon constexprs) of the kernel for ``np_cols`` (8 or 16) columns of x^T, ``row_tiles``
    16-row tiles per CTA, ``warps`` warps splitting K inside the CTA (the leading axis of every tile), ``ks`` blocks
    per lane per K step. W_LAYOUT, words [W, BN, 4, 2KS]: lane (g, t) holds the words of blocks t*KS.. of rows g and
    g + 8 of each tile (the A fragment's rows), contiguous (one 8 * KS-byte load a row); S_LAYOUT, scale bytes
    [W, BN, 4, KS], the same threads; X_LAYOUT, x [W, NP, 4, 16KS]: lane (g, t) holds columns g (and g + 8) and the
    16KS values of its blocks; MMA_LAYOUT: NVMMADistributedLayout version [2, 0], [W, BN, NP], a warp per batch."""
    import triton.experimental.gluon.language as gl

    bn = 16 * row_tiles
    lw = _log2(warps)
    rows = [[8]] + [[16 << i] for i in range(_log2(row_tiles))]

    def bases(prefix_regs, nd, row_dim, lane_t_dim):
        lanes = [[0] * nd for _ in range(5)]
        lanes[0][lane_t_dim], lanes[1][lane_t_dim] = 1, 2
        for i in range(3):
            lanes[2 + i][row_dim] = 1 << i
        return lanes

    w_regs = [[0, 0, 0, 1 << b] for b in range(_log2(2 * ks))] + [[0, r[0], 0, 0] for r in rows]
    w_layout = gl.DistributedLinearLayout(
        reg_bases=w_regs, lane_bases=bases(None, 4, 1, 2), warp_bases=[[1 << i, 0, 0, 0] for i in range(lw)],
        block_bases=[], shape=[warps, bn, 4, 2 * ks])
    s_regs = [[0, 0, 0, 1 << b] for b in range(_log2(ks))] + [[0, r[0], 0, 0] for r in rows]
    s_layout = gl.DistributedLinearLayout(
        reg_bases=s_regs, lane_bases=bases(None, 4, 1, 2), warp_bases=[[1 << i, 0, 0, 0] for i in range(lw)],
        block_bases=[], shape=[warps, bn, 4, ks])
    x_regs = [[0, 0, 0, 1 << b] for b in range(_log2(8 * ks))] + ([[0, 8, 0, 0]] if np_cols == 16 else [])
    x_layout = gl.DistributedLinearLayout(
        reg_bases=x_regs, lane_bases=bases(None, 4, 1, 2), warp_bases=[[1 << i, 0, 0, 0] for i in range(lw)],
        block_bases=[], shape=[warps, np_cols, 4, 8 * ks])
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[warps, 1, 1], instr_shape=[1, 16, 8])
    return dict(BN=bn, W=warps, KS=ks, W_LAYOUT=w_layout, S_LAYOUT=s_layout, X_LAYOUT=x_layout, MMA_LAYOUT=mma)


def compile_sm(dtype: torch.dtype = torch.bfloat16, m: int = 16, has_bias: bool = False, split: bool = True,
               capability: int = 90, row_tiles: int = 2, warps: int = 4, ks: int = KS,
               depth: int = DEPTH, even: bool = True):
    """Compile the kernel ahead of time for ``sm_<capability>`` (no GPU needed); returns Triton's compiled kernel
    (``.asm["ptx"]``, ``.asm["cubin"]``). The tests and the SASS checks use it. Under Triton's interpreter the
    compile runs in a fresh process without it (``gluon_compile``: ``gl.sum`` cannot be compiled there) and what
    comes back carries ``.asm`` and ``.metadata`` only."""
    from engine.platforms.cuda.gluon_compile import compile_outside_interpreter, interpreter_on

    if interpreter_on():
        return compile_outside_interpreter(__name__, "compile_sm", dict(
            dtype=dtype, m=m, has_bias=has_bias, split=split, capability=capability, row_tiles=row_tiles,
            warps=warps, ks=ks, depth=depth, even=even))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _kernels()
    xt = "bf16" if dtype == torch.bfloat16 else "fp16"
    sig = dict(x_ptr=f"*{xt}", w_ptr="*i32", s_ptr="*u8", gs_ptr="*fp32", bias_ptr=f"*{xt}", out_ptr=f"*{xt}",
               part_ptr="*fp32", M="i32", N="i32", stride_xm="i32", stride_wn="i32", stride_sn="i32",
               stride_om="i32", steps_per_split="i32", steps="i32")
    np_cols = 8 if m <= 8 else 16
    consts = dict(HAS_BIAS=has_bias, SPLIT=split, BF16=dtype == torch.bfloat16, NP=np_cols, DEPTH=depth, EVEN=even,
                  **layouts(np_cols, row_tiles, warps, ks))
    sig.update({k: "constexpr" for k in consts})
    # pointers 16-byte aligned and the strides multiples of 16, as the launcher specializes them on a GPU
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12)}
    src = GluonASTSource(kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                          options=dict(num_warps=warps, **_reg_cap(warps)))


def _reg_cap(warps: int) -> dict:
    """16 warps fit an SM only at <= 128 registers a thread: ask ptxas for that (it needs 126-128 at M <= 8)."""
    return {"maxnreg": 65536 // (32 * warps)} if warps >= 16 else {}


# ----------------------------------------------------------------------------------------------------------------
# host side


@functools.cache
def _layouts_cached(np_cols: int, row_tiles: int, warps: int, ks: int) -> dict:
    return layouts(np_cols, row_tiles, warps, ks)


def plan(n: int, steps: int, np_cols: int, sms: int, cfg: dict | None = None) -> tuple[int, int, int, int]:
    """(row_tiles, warps, splits, steps_per_split) for N rows of W, ``steps`` K steps and NP columns of x^T on
    ``sms`` SMs (see the tile notes above); ``cfg`` entries (row_tiles, warps, splits) override. Shapes only, so
    capture-safe."""
    cfg = cfg or {}
    if np_cols > 8:
        row_tiles = cfg.get("row_tiles", 2 if -(-n // 32) <= sms else 4)
        max_warps = 8 if row_tiles <= 2 else 4
    else:
        row_tiles = cfg.get("row_tiles", 2)
        max_warps = 16
    programs = -(-n // (16 * row_tiles))
    warps = cfg.get("warps")
    if warps is None:
        warps = MIN_WARPS
        while warps < max_warps and programs * warps * 2 <= WARPS_PER_SM * sms and warps < steps:
            warps *= 2
    rounds = -(-steps // warps)  # a round: one step for each warp of the CTA
    if "splits" in cfg:
        splits = max(1, min(cfg["splits"], rounds))
    elif 8 * programs * warps < WARPS_PER_SM * sms:
        splits = min(-(-WARPS_PER_SM * sms // (programs * warps)), rounds)
    else:
        splits = 1
    per_split = -(-rounds // splits) * warps
    return row_tiles, warps, -(-steps // per_split), per_split


def w4a16_mma_linear(x, w_packed, w_block_scale, w_global_scale, bias=None, *, config=None):
    """nvfp4_linear (W4A16) for M <= 16 rows of bf16 / fp16 x with K % 64 == 0: out [M, N] in x's dtype.
    ``config`` (tuning: row_tiles, warps, splits, ks, depth, sms) overrides the defaults (:func:`plan`)."""
    from engine.platforms.triton_kernels import sm_count
    from engine.platforms.triton_kernels.nvfp4 import _words, splitk_reduce

    cfg = dict(config or {})
    m, k = x.shape
    n = w_packed.shape[0]
    if m > MAX_M or k % K_STEP or x.dtype not in X_DTYPES:
        raise ValueError(f"the Gluon NVFP4 kernel takes M <= {MAX_M} rows of bf16/fp16 x with K % {K_STEP} == 0, "
                         f"got x {tuple(x.shape)} {x.dtype}")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if x.stride(-1) != 1 or x.data_ptr() % 16 or (m > 1 and x.stride(0) % 8):
        x = x.clone(memory_format=torch.contiguous_format)  # x is read as 16-byte vectors
    words = _words(w_packed)
    if words.data_ptr() % 8:  # a block's two words are one 8-byte load
        words = words.clone()
    scales = w_block_scale.view(torch.uint8)
    gs = w_global_scale.reshape(1)
    np_cols = 8 if m <= 8 else 16
    ks = cfg.get("ks", KS)
    if k % (K_STEP * ks):
        ks = 1
    sms = cfg.get("sms", sm_count(x.device, 4))
    row_tiles, warps, splits, per_split = plan(n, k // (K_STEP * ks), np_cols, sms, cfg)
    lay = _layouts_cached(np_cols, row_tiles, warps, ks)
    programs = -(-n // lay["BN"])
    steps = k // (K_STEP * ks)
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    has_bias = bias is not None
    _kernels()[(programs, splits)](
        x, words, scales, gs, bias if has_bias else gs, out, part, m, n, x.stride(0), words.stride(0),
        scales.stride(0), out.stride(0), per_split, steps, HAS_BIAS=has_bias and splits == 1, SPLIT=splits > 1,
        BF16=x.dtype == torch.bfloat16, NP=np_cols, DEPTH=cfg.get("depth", DEPTH),
        EVEN=steps % warps == 0 and per_split % warps == 0, **lay, num_warps=warps, **_reg_cap(warps))
    return splitk_reduce(part, bias, out) if splits > 1 else out


# ----------------------------------------------------------------------------------------------------------------
# gate and registration

# Compute capabilities the kernel is enabled on: measured on the H200 (sm_90). It compiles for sm_80 and sm_100 too
# (mma.sync m16n8k16 exists there), but is not measured there, so the Triton kernels keep those.
CAPABILITIES = ((9, 0),)
# Rows of x it takes: from 2, where it beats the portable default on the H200 (M = 2: 19.7 / 16.9 us against the
# GEMV's 20.0 / 18.9 on 4096x14336 / 14336x4096; M = 1 it loses, 18.2 / 16.6 against 15.2 / 15.6).
MIN_M = 2


@functools.cache
def _device_capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def make_supports(device_type: str = "cuda", capability_of=None, min_m: int | None = None,
                  max_m: int | None = None):
    """``supports`` for nvfp4_linear: True, or the reason this kernel declines (the call then falls through to the
    Triton kernels). ``capability_of(device)`` gives a tensor's device capability (tests stand one in)."""
    from engine.platforms.triton_kernels.nvfp4 import _linear_verdict

    def cap_of(device):
        if capability_of is not None:
            return capability_of(device)
        return _device_capability(device.index if device.index is not None else torch.cuda.current_device())

    def supports(x, w_packed, w_block_scale, w_global_scale, bias):
        ok = _linear_verdict(device_type, x, w_packed, w_block_scale, w_global_scale, bias)
        if ok is not True:
            return ok
        cap = tuple(cap_of(x.device))
        if cap not in CAPABILITIES:
            return f"compute capability {cap[0]}.{cap[1]}: the Gluon NVFP4 kernel is enabled on {CAPABILITIES} only"
        if x.dtype not in X_DTYPES:
            return f"x dtype {x.dtype}: the Gluon NVFP4 kernel takes bf16 / fp16"
        lo = MIN_M if min_m is None else min_m
        hi = MAX_M if max_m is None else max_m
        if not lo <= x.shape[0] <= hi:
            return f"M = {x.shape[0]} rows: the Gluon NVFP4 kernel takes {lo} <= M <= {hi}"
        if x.shape[1] % K_STEP:
            return f"K = {x.shape[1]}: the Gluon NVFP4 kernel needs K % {K_STEP} == 0"
        return True

    return supports


def register(registry, device_type: str, capability=None) -> None:
    """Register the Gluon W4A16 kernel for ``nvfp4_linear`` where it runs (cuda, an enabled capability, Gluon with
    what it uses); otherwise record why it is skipped."""
    name = "gluon_nvfp4_w4a16_mma"
    if device_type != "cuda":
        return
    ok, why = gluon_status()
    if not ok:
        registry.skip(nvfp4_linear, name, why)
        return
    if capability is None or tuple(capability) not in CAPABILITIES:
        registry.skip(nvfp4_linear, name, f"compute capability {capability}: enabled on {CAPABILITIES} only")
        return
    # fp16 x is computed (and tested in tests/platforms/cuda) too, but the op's conformance cases have no fp16
    registry.register(nvfp4_linear, w4a16_mma_linear, name=name, supports=make_supports(device_type),
                      priority=PRIORITY, dtypes=(torch.bfloat16,),
                      note=f"Gluon W4A16, mma.sync with the weight decoded into register A fragments, "
                           f"{MIN_M} <= M <= {MAX_M}, bf16/fp16 x, K % {K_STEP} == 0")
