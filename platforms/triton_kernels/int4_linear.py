"""``int4_linear`` in Triton: GPTQ / AWQ 4-bit weights (core/ops/int4.py's layout) multiplied without expanding them.

* M <= GEMV_DEFAULT_MAX_M (decode): a GEMV on CUDA cores with the NVFP4 GEMV's tile (nvfp4.py): the K axis in units
  of 16 codes spread over the lanes, one 8-byte load per row and unit, the rows inside each thread so every x value is
  loaded once for all of them. A code becomes fp32 by the exponent trick (``code | 0x4B000000`` is 2**23 + code,
  exactly), minus 2**23 + zero: the integer ``code - zero``, exact; unit sums are scaled once by their group's
  scale. The GGUF Q4 blocks the CPU runs are 18 or 20 bytes, read as 16-bit words; here every load is 8 bytes.
* larger M: tensor cores, "swap AB" (the weight tile [BLOCK_N, K step] is the left operand, x^T the right one): the
  eight nibble planes of a step's words become ``(code - zero) * scale`` rounded to x's dtype (the op's 16-bit
  tolerance allows it), put back in K order, fp32 accumulation; fp32 x takes an IEEE fp32 dot.
K is split (fp32 partials, one reduction launch) while N alone leaves SMs idle.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.core.ops.int4 import check_int4, int4_linear
from engine.platforms.triton_kernels import interpreting, sm_count
from engine.platforms.triton_kernels.group_quant import choose_kernel, group_supports, launch_operands
from engine.platforms.triton_kernels.nvfp4 import (
    _gemv_block,
    _gemv_store,
    _k_order,
    _pair_dot,
    gemv_plan,
    plane_order,
    split_plan,
    splitk_reduce,
)

PRIORITY = 10
UNIT = 16  # codes per 8-byte load of the GEMV
GEMV_MAX_M = 4
# Rows of x up to which the GEMV is the default (it takes up to GEMV_MAX_M). H100, 2026-12-08 (benchmarks/gpu/int4.py,
# 8B shapes, groups of 128 with zeros): at M = 4 the tensor-core kernel took 28.5-44.0 us against the GEMV's 16.7-61.4
# (1.62-1.94x cuBLAS bf16 against 1.39-1.44x); at M = 1 the GEMV 2.42-2.71x against 1.61-1.98x; M = 2 about even
GEMV_DEFAULT_MAX_M = 2
# ... for groups of 32 / 64 (GGUF Q4_0), whose tensor-core steps read a per-word scale tile (WIDEN off): the GEMV up to
# 4 rows (M = 4: 1.39-1.49x cuBLAS bf16; the tensor-core kernel at M = 16 0.57-0.86x, H100 2026-12-08)
GEMV_DEFAULT_MAX_M_SMALL_GROUPS = 4
GEMV_BLOCK_N = 4  # rows of W per GEMV program (M = 1), units per loop step, warps: the NVFP4 GEMV's tile
GEMV_BLOCK_B = 128
GEMV_WARPS = 4
GEMV_MR_BLOCK_N = 4  # M = 2..4
GEMV_MR_BLOCK_B = 64
GEMV_MR_WARPS = 2
GEMV_STAGES = 2
# Decode the nibbles in place (see _mantissa_planes) at M = 1, a shift per value above. H100, 2026-12-07 (benchmarks/
# gpu/int4.py, 8B shapes): M = 1 in place 7.5-36.6 us against 7.8-39.0 with shifts; M = 4 14.5-65.8 us with shifts
# against 15.9-71.0 in place (the MR tile's x scaling costs more than the shifts it saves)
GEMV_MANTISSA_MAX_M = 1
PROGRAMS_PER_SM = 8
MIN_SPLIT_BLOCK_B = 32
DOT_PROGRAMS_PER_SM = 4
# 16-bit x on sm_90: the words decoded by inline PTX into packed 16-bit pairs (2 instructions a value against ~4.5
# through fp32; it rounds the scale to x's dtype first). With the K-ordered tile it was correct on an H100 and no faster
# (135.8 against 136.2 us at M = 16 on 28672 x 4096, 2026-12-07): the layout conversions bounded that tile. With the
# plane-pair dots (DOT_PLANES) a step is 366 SASS instructions a warp against 554 through fp32 and 601 before (sm_90,
# BLOCK 128 x 64 x 16 words, counted offline 2026-12-08)
DOT_ASM = True
DOT_PLANES = True
# See _dot_kernel's WIDEN: correct under the interpreter and 9 -> 2 barriers a step in sm_90 SASS compiled here, but
# not yet run on a GPU (no device time was left, 2026-12-08), and Triton 3.6 (the GPU image's) once miscompiled a
# similar widening (nvfp4's SBLK with plane-wise dots): off until a GPU run checks and times it (benchmarks/gpu/int4.py
# has the row)
DOT_WIDEN = False
INTERPRETER_SMS = 4  # a small fake SM count under the interpreter, so the split-K paths run in CI


@triton.jit
def _minus(w, SHIFT: tl.constexpr, c, magic):
    """fp32 ``code - zero`` of the nibble at SHIFT of int32 words ``w``, where ``c`` is 2**23 + zero."""
    return (((w >> SHIFT) & 0xF) | magic).to(tl.float32, bitcast=True) - c


@triton.jit
def _planes(w, c, magic=0x4B000000):
    """int32 words of 8 codes (element e at bits 4e) -> the 8 planes ``code - zero`` (fp32, exact)."""
    return (_minus(w, 0, c, magic), _minus(w, 4, c, magic), _minus(w, 8, c, magic), _minus(w, 12, c, magic),
            _minus(w, 16, c, magic), _minus(w, 20, c, magic), _minus(w, 24, c, magic), _minus(w, 28, c, magic))


@triton.jit
def _masked(w, MASK: tl.constexpr, c, magic):
    """fp32 ``(w & MASK) + 2**23 - c``: one nibble left where it sits in the mantissa, exact."""
    return ((w & MASK) | magic).to(tl.float32, bitcast=True) - c


@triton.jit
def _mantissa_planes(w, c0, c1, c2, c3, c4, magic):
    """int32 words of 8 codes -> the 8 planes ``(code - zero) * 2**(4 e')`` with e' = 0, 1, 2, 3, 4, 1, 2, 3 (exact),
    where ``c_j = 2**23 + zero * 2**(4 j)``: each nibble is masked in place into the mantissa of 2**23 (one lop3), the
    top three after one shift of the word; no shift per value. The x values take the 2**-(4 e') instead
    (nvfp4._gemv_block's X_SHIFT), once per value for all the tile's rows."""
    h = w >> 16
    return (_masked(w, 0xF, c0, magic), _masked(w, 0xF0, c1, magic), _masked(w, 0xF00, c2, magic),
            _masked(w, 0xF000, c3, magic), _masked(w, 0xF0000, c4, magic), _masked(h, 0xF0, c1, magic),
            _masked(h, 0xF00, c2, magic), _masked(h, 0xF000, c3, magic))


@triton.jit
def _mantissa_offsets(c):
    """c_0..c_4 of :func:`_mantissa_planes` from ``c = 2**23 + zero`` (a tile, or the constant of zero 8)."""
    z = c - 8388608.0
    return c, z * 16.0 + 8388608.0, z * 256.0 + 8388608.0, z * 4096.0 + 8388608.0, z * 65536.0 + 8388608.0


@triton.jit
def _group_params(s_rows, z_rows, g, mask, HAS_ZERO: tl.constexpr):
    """(fp32 scale, fp32 2**23 + zero) of groups ``g``."""
    if mask is None:
        s = tl.load(s_rows + g).to(tl.float32)
    else:
        s = tl.load(s_rows + g, mask=mask, other=0).to(tl.float32)
    if HAS_ZERO:
        if mask is None:
            z = tl.load(z_rows + g).to(tl.float32) + 8388608.0
        else:
            z = tl.load(z_rows + g, mask=mask, other=0).to(tl.float32) + 8388608.0
    else:
        z = 8388616.0
    return s, z


def _asm_decode_text(bf16: bool) -> str:
    """PTX: int32 word $8 (8 codes, element e at bits 4e), the 16-bit ``magic + zero`` $9 and the 16-bit scale $10
    -> the 8 values ``(code - zero) * scale`` in x's dtype, $0..$7 in element order. Codes i and i + 4 become one
    16-bit pair by a shift and one lop3 (``(w >> 4i) & 0x000F000F | magic``: the pair ``magic + code``, exact, with
    magic 128 in bf16 and 1024 in fp16, whose unit in the last place is 1), then a packed subtraction (exact) and a
    packed multiply by the scale pair (one rounding): two values in four instructions."""
    magic, kind = ("0x43004300", "bf16x2") if bf16 else ("0x64006400", "f16x2")
    lines = ["{", ".reg .b32 a, z2, s2;", "mov.b32 z2, {$9, $9};", "mov.b32 s2, {$10, $10};"]
    for i in range(4):
        lines.append(f"shr.b32 a, $8, {4 * i};" if i else "mov.b32 a, $8;")
        lines += [f"lop3.b32 a, a, 0x000F000F, {magic}, 0xEA;",  # (a & b) | c
                  f"sub.rn.{kind} a, a, z2;", f"mul.rn.{kind} a, a, s2;", f"mov.b32 {{${i}, ${i + 4}}}, a;"]
    return "\n".join(lines + ["}"])


_ASM_BF16 = tl.constexpr(_asm_decode_text(True))
_ASM_F16 = tl.constexpr(_asm_decode_text(False))


@triton.jit
def _decode_asm(w, zm, s16):
    """int32 words, 16-bit ``magic + zero`` and scales (x's dtype) -> 8 planes of ``(code - zero) * scale``."""
    if s16.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_ASM_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, zm, s16],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(_ASM_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, zm, s16],
                                         dtype=(tl.float16,) * 8, is_pure=True, pack=1)


@triton.jit(do_not_specialize=["ZERO"])
def _gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, part_ptr, M, N, NB, UPG, stride_xm, stride_wn,
                 stride_sn, stride_zn, stride_om, blocks_per_split, ZERO, HAS_ZERO: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_B: tl.constexpr, EVEN: tl.constexpr, MANTISSA: tl.constexpr = False):
    """CUDA-core GEMV for up to 4 rows of x over int64 words (16 codes each) [N, NB]. Tile [BLOCK_B units, BLOCK_N
    rows]; UPG is units per group. Program (pid_n, pid_k) covers rows pid_n * BLOCK_N .. and units pid_k *
    blocks_per_split ..; with SPLIT, fp32 partials go to part_ptr [splits, M, N]. EVEN: no load needs a mask. ZERO
    is 0: added to the unit index it keeps Triton from reordering the tile's layout (see nvfp4._gemv_kernel).
    MANTISSA: the codes are decoded in place (:func:`_mantissa_planes`: 3 instructions a value with the FMA, against
    4 with a shift each) and x takes the powers of two."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    rows64 = rows.to(tl.int64)
    w_rows = w_ptr + rows64[None, :] * stride_wn
    s_rows = s_ptr + rows64[None, :] * stride_sn
    z_rows = z_ptr + rows64[None, :] * stride_zn
    b_start = pid_k * blocks_per_split
    b_end = tl.minimum(b_start + blocks_per_split, NB)
    acc0 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    x1_row = x_ptr + tl.minimum(1, M - 1) * stride_xm  # rows past M read row M - 1 again; never stored
    x2_row = x_ptr + tl.minimum(2, M - 1) * stride_xm
    x3_row = x_ptr + tl.minimum(3, M - 1) * stride_xm
    bb = tl.arange(0, BLOCK_B)[:, None] + ZERO
    magic = ZERO + 0x4B000000  # 2**23's bits as a register value: the mask is then each lop3's one immediate
    for k0 in range(b_start, b_end, BLOCK_B):
        blks = k0 + bb
        # The hint gives the group index the contiguity of the unit index (its divisibility stays 1 through ZERO, so
        # every load stays one element): the scale and zero tiles then load in the words' layout. Without it Triton
        # loaded them in another and moved all 16 decoded planes across through shared memory, 70 barriers a step
        # (sm_90 SASS, 2026-12-08).
        g = tl.max_contiguous(blks // UPG, [BLOCK_B, 1])
        if EVEN:
            bmask = None
            w = tl.load(w_rows + blks)
            s, c = _group_params(s_rows, z_rows, g, None, HAS_ZERO)
        else:
            bmask = blks < b_end
            m2 = bmask & rmask[None, :]
            w = tl.load(w_rows + blks, mask=m2, other=0)
            s, c = _group_params(s_rows, z_rows, g, m2, HAS_ZERO)
        if MANTISSA:
            c0, c1, c2, c3, c4 = _mantissa_offsets(c)
            a0, a1, a2, a3, a4, a5, a6, a7 = _mantissa_planes(w.to(tl.int32), c0, c1, c2, c3, c4, magic)
            b0, b1, b2, b3, b4, b5, b6, b7 = _mantissa_planes((w >> 32).to(tl.int32), c0, c1, c2, c3, c4, magic)
        else:
            a0, a1, a2, a3, a4, a5, a6, a7 = _planes(w.to(tl.int32), c, magic)
            b0, b1, b2, b3, b4, b5, b6, b7 = _planes((w >> 32).to(tl.int32), c, magic)
        acc0 += _gemv_block(x_ptr, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
                            MANTISSA) * s
        if BLOCK_M > 1:
            acc1 += _gemv_block(x1_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7,
                                b0, b1, b2, b3, b4, b5, b6, b7, MANTISSA) * s
        if BLOCK_M > 2:
            acc2 += _gemv_block(x2_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7,
                                b0, b1, b2, b3, b4, b5, b6, b7, MANTISSA) * s
            acc3 += _gemv_block(x3_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7,
                                b0, b1, b2, b3, b4, b5, b6, b7, MANTISSA) * s
    _gemv_store(acc0, 0, 1.0, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)
    if BLOCK_M > 1:
        _gemv_store(acc1, 1, 1.0, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)
    if BLOCK_M > 2:
        _gemv_store(acc2, 2, 1.0, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)
        _gemv_store(acc3, 3, 1.0, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)


@triton.jit
def _dot_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, part_ptr, M, N, KW, stride_xm, stride_wn, stride_sn,
                stride_zn, stride_om, words_per_split, WPG: tl.constexpr, HAS_ZERO: tl.constexpr,
                HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, ASM: tl.constexpr = False,
                ONE_GROUP: tl.constexpr = False, PLANES: tl.constexpr = False, AHEAD: tl.constexpr = False,
                WIDEN: tl.constexpr = False):
    """Tensor cores, swap AB: out^T [BLOCK_N, BLOCK_M] += W [BLOCK_N, 8 BLOCK_T] @ x^T over int32 words (8 codes
    each) [N, KW]; WPG is words per group. Program (pid_n, pid_m, pid_k) covers words pid_k * words_per_split ..;
    with SPLIT, fp32 partials go to part_ptr [splits, M, N]. ASM (16-bit x; never under the interpreter): the words
    are decoded by inline PTX into 16-bit pairs (:func:`_asm_decode_text`), the scale rounded to x's dtype first.
    ONE_GROUP: every K step lies in one group (WPG a multiple of BLOCK_T, and splits on step boundaries), so the
    scale and zero are loaded once per row and step ([BLOCK_N, 1]) instead of once per word; AHEAD: a step ahead
    (the loads' latency hidden, at the cost of a layout conversion through shared memory a step: 4 more barriers).
    WIDEN (PLANES, several whole groups a step): one scale / zero load per group, widened along the words (a per-word
    tile went through shared memory each step: 9 barriers against 2 at M = 16, groups of 32).
    PLANES: x comes permuted by :func:`plane_order` and every split is whole steps (no K mask): a step is four dots,
    each on two nibble planes joined along K (as the PTX decode leaves them in one register); otherwise the eight
    planes are interleaved back into K order for one dot against x as it is (layout conversions through shared
    memory: ~1.6x the instructions a step, sm_90 SASS, 2026-12-08)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tt = tl.arange(0, BLOCK_T)
    rmask = rows < N
    mmask = ms < M
    rows64 = rows.to(tl.int64)
    w_rows = w_ptr + rows64[:, None] * stride_wn
    s_rows = s_ptr + rows64[:, None] * stride_sn
    z_rows = z_ptr + rows64[:, None] * stride_zn
    x_cols = x_ptr + ms.to(tl.int64)[None, :] * stride_xm
    DT: tl.constexpr = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    t_start = pid_k * words_per_split
    t_end = tl.minimum(t_start + words_per_split, KW)
    if ONE_GROUP and AHEAD:  # the first step's group; each step loads the next one's before its own decode
        s_next, c_next = _group_params(s_rows, z_rows, t_start // WPG, rmask[:, None], HAS_ZERO)
    for k0w in range(t_start, t_end, BLOCK_T):
        t = k0w + tt
        if PLANES:
            m2 = rmask[:, None]
        else:
            m2 = rmask[:, None] & (t < t_end)[None, :]
        w = tl.load(w_rows + t[None, :], mask=m2, other=0)
        if ONE_GROUP and not AHEAD:
            s, c = _group_params(s_rows, z_rows, k0w // WPG, rmask[:, None], HAS_ZERO)
        elif ONE_GROUP:
            s, c = s_next, c_next
            # the last step loads its own group again (in bounds) rather than masking a scalar condition
            s_next, c_next = _group_params(s_rows, z_rows, tl.minimum(k0w + BLOCK_T, t_end - 1) // WPG,
                                           rmask[:, None], HAS_ZERO)
        elif WIDEN:  # whole groups in a step: one load per group, widened along the words
            GPS: tl.constexpr = BLOCK_T // WPG
            s, c = _group_params(s_rows, z_rows, (k0w // WPG + tl.arange(0, GPS))[None, :], rmask[:, None], HAS_ZERO)
            s = tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_N, GPS, WPG]), [BLOCK_N, BLOCK_T])
            if HAS_ZERO:
                c = tl.reshape(tl.broadcast_to(c[:, :, None], [BLOCK_N, GPS, WPG]), [BLOCK_N, BLOCK_T])
        else:
            s, c = _group_params(s_rows, z_rows, (t // WPG)[None, :], m2, HAS_ZERO)
        if ASM:
            s = tl.broadcast_to(s, [BLOCK_N, BLOCK_T])  # the PTX takes one scale and zero per word
            if DT == tl.bfloat16:
                zm = (s * 0.0 + (c - 8388480.0)).to(DT)  # 128 + zero, as a tile even where c is a constant
            else:
                zm = (s * 0.0 + (c - 8387584.0)).to(DT)  # 1024 + zero
            v0, v1, v2, v3, v4, v5, v6, v7 = _decode_asm(w, zm, s.to(DT))
        else:
            v0, v1, v2, v3, v4, v5, v6, v7 = _planes(w, c)
            v0, v1, v2, v3, v4, v5, v6, v7 = v0 * s, v1 * s, v2 * s, v3 * s, v4 * s, v5 * s, v6 * s, v7 * s
        if PLANES:
            # x^T rows (8t + e, 8t + e + 4) for t = 0 .. BLOCK_T - 1 are the contiguous run 2 e BLOCK_T ..
            xp = x_cols + (k0w * 8 + tl.arange(0, 2 * BLOCK_T))[:, None]
            acc = _pair_dot(acc, v0, v4, xp, mmask, DT, INTERPRET)
            acc = _pair_dot(acc, v1, v5, xp + 2 * BLOCK_T, mmask, DT, INTERPRET)
            acc = _pair_dot(acc, v2, v6, xp + 4 * BLOCK_T, mmask, DT, INTERPRET)
            acc = _pair_dot(acc, v3, v7, xp + 6 * BLOCK_T, mmask, DT, INTERPRET)
        else:
            a = _k_order(v0, v1, v2, v3, v4, v5, v6, v7)  # [BN, 8T] in K order
            kk = k0w * 8 + tl.arange(0, 8 * BLOCK_T)
            xt = tl.load(x_cols + kk[:, None], mask=(kk < t_end * 8)[:, None] & mmask[None, :], other=0.0)
            if INTERPRET:  # the interpreter's 16-bit dot is wrong; fp32 tiles (of the rounded values) are right
                acc = tl.dot(a.to(DT).to(tl.float32), xt.to(tl.float32), acc)
            elif DT == tl.float32:
                acc = tl.dot(a, xt, acc, input_precision="ieee")
            else:
                acc = tl.dot(a.to(DT), xt, acc)
    omask = rmask[:, None] & mmask[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + ms.to(tl.int64))[None, :] * N + rows[:, None], acc, mask=omask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + ms.to(tl.int64)[None, :] * stride_om + rows[:, None], acc.to(out_ptr.dtype.element_ty),
                 mask=omask)


def default_gemv_max_m(group_size: int, k: int, dtype: torch.dtype) -> int:
    """Rows of x up to which the GEMV runs by default: GEMV_DEFAULT_MAX_M where each tensor-core step lies in one
    group (or DOT_WIDEN serves several), else GEMV_DEFAULT_MAX_M_SMALL_GROUPS."""
    one_group_steps = group_size >= k or group_size % (8 * dot_config(GEMV_MAX_M + 1, dtype)["block_t"]) == 0
    return GEMV_DEFAULT_MAX_M if one_group_steps or DOT_WIDEN else GEMV_DEFAULT_MAX_M_SMALL_GROUPS


def gemv_config(n: int, m: int, sms: int) -> tuple[int, int, int, int]:
    """(block_n, block_b, num_warps, programs_per_sm) of the GEMV for N rows of W and M rows of x."""
    if m > 1:
        return GEMV_MR_BLOCK_N, GEMV_MR_BLOCK_B, GEMV_MR_WARPS, PROGRAMS_PER_SM
    block_n = GEMV_BLOCK_N
    while block_n > 2 and triton.cdiv(n, block_n) < PROGRAMS_PER_SM * sms // 2:
        block_n //= 2
    return block_n, GEMV_BLOCK_B, GEMV_WARPS, PROGRAMS_PER_SM // 2


def dot_config(m: int, dtype: torch.dtype) -> dict:
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    if dtype == torch.float32:
        return dict(block_m=min(block_m, 64), block_n=64, block_t=8, num_warps=8, num_stages=2)
    return dict(block_m=block_m, block_n=128 if block_m >= 64 else 64, block_t=16, num_warps=8 if block_m >= 64 else 4,
                num_stages=3)


def ptx_sm90(device: torch.device) -> bool:
    """Whether the inline PTX decode may run on ``device``: an NVIDIA GPU (not ROCm, not the interpreter) of compute
    capability >= 9.0 (``sub.bf16x2`` / ``mul.bf16x2``)."""
    if device.type != "cuda" or interpreting() or torch.version.hip:
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (9, 0)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def _aligned(t: torch.Tensor, alignment: int) -> torch.Tensor:
    return t if t.data_ptr() % alignment == 0 else t.clone()


def int4_linear_triton(x, w_packed, w_scale, w_zero, group_size, bias=None, *, kernel: str | None = None,
                       config: dict | None = None):
    """int4_linear: out [M, N] = x @ dequant(w)^T (+ bias) in x.dtype. ``kernel`` ("gemv" or "dot") and ``config``
    (block sizes, warps, stages, splits) override the heuristics for the benchmark's sweep."""
    x, out, zero, bias, bias_arg = launch_operands(x, w_packed, w_scale, w_zero, bias)
    (m, k), n = x.shape, out.shape[1]
    if m == 0 or n == 0:
        return out
    has_zero, has_bias = w_zero is not None, bias is not None
    cfg = dict(config or {})
    sms = cfg.get("sms", sm_count(x.device, INTERPRETER_SMS))
    if choose_kernel(kernel, m, default_gemv_max_m(group_size, k, x.dtype), GEMV_MAX_M) == "gemv":
        words = _aligned(w_packed, 8).view(torch.int64)  # [N, K/16]: rows are K/2 bytes, K % 32 == 0
        nb = k // UNIT
        block_n, block_b, warps, per_sm = gemv_config(n, m, sms)
        block_n = cfg.get("block_n", block_n)
        block_b, splits, per_split = gemv_plan(n, nb, sms, block_n, cfg.get("block_b", block_b), per_sm,
                                               MIN_SPLIT_BLOCK_B, splits=cfg.get("splits"))
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
        if x.element_size() == 2 and (x.data_ptr() % 8 or (m > 1 and x.stride(0) % 4)):
            x = x.clone(memory_format=torch.contiguous_format)  # the kernel reads 16-bit x as 8-byte words
        _gemv_kernel[(triton.cdiv(n, block_n), splits)](
            x, words, w_scale, zero, bias_arg, out, part, m, n, nb, group_size // UNIT, x.stride(0), words.stride(0),
            w_scale.stride(0), zero.stride(0), out.stride(0), per_split, 0, HAS_ZERO=has_zero, HAS_BIAS=has_bias,
            SPLIT=splits > 1, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_B=block_b,
            EVEN=n % block_n == 0 and nb % per_split == 0, MANTISSA=bool(cfg.get("mantissa", m <= GEMV_MANTISSA_MAX_M)),
            num_warps=cfg.get("num_warps", warps),
            num_stages=cfg.get("num_stages", GEMV_STAGES))
        return splitk_reduce(part, bias, out) if splits > 1 else out
    words = _aligned(w_packed, 4).view(torch.int32)  # [N, K/8]
    kw = k // 8
    dc = dot_config(m, x.dtype)
    dc.update(cfg)
    programs = triton.cdiv(n, dc["block_n"]) * triton.cdiv(m, dc["block_m"])
    splits, per_split = split_plan(programs, triton.cdiv(kw, dc["block_t"]), dc["block_t"], sms, DOT_PROGRAMS_PER_SM,
                                   cfg.get("splits"))
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    planes = bool(dc.get("planes", DOT_PLANES)) and kw % per_split == 0 and per_split % dc["block_t"] == 0
    if planes:
        x = plane_order(x, dc["block_t"])
    _dot_kernel[(triton.cdiv(n, dc["block_n"]), triton.cdiv(m, dc["block_m"]), splits)](
        x, words, w_scale, zero, bias_arg, out, part, m, n, kw, x.stride(0), words.stride(0), w_scale.stride(0),
        zero.stride(0), out.stride(0), per_split, WPG=group_size // 8, HAS_ZERO=has_zero, HAS_BIAS=has_bias,
        SPLIT=splits > 1, INTERPRET=interpreting(), BLOCK_M=dc["block_m"], BLOCK_N=dc["block_n"],
        BLOCK_T=dc["block_t"], ASM=bool(dc.get("asm", DOT_ASM)) and x.element_size() == 2 and ptx_sm90(x.device),
        ONE_GROUP=(group_size // 8) % dc["block_t"] == 0 and per_split % dc["block_t"] == 0, PLANES=planes,
        AHEAD=bool(dc.get("ahead", False)),
        WIDEN=planes and dc["block_t"] % (group_size // 8) == 0 and bool(dc.get("widen", DOT_WIDEN)),
        num_warps=dc["num_warps"], num_stages=dc["num_stages"])
    return splitk_reduce(part, bias, out) if splits > 1 else out


def supports_for(device_type: str):
    return group_supports(device_type, check_int4, "w_packed")


def register(registry, device_type: str, capability=None) -> None:
    registry.register(int4_linear, int4_linear_triton, name="triton_int4_w4a16", supports=supports_for(device_type),
                      priority=PRIORITY,
                      note=f"Triton W4A16 for GPTQ / AWQ weights: CUDA-core GEMV with 8-byte loads for M <= "
                           f"{GEMV_DEFAULT_MAX_M} (split-K when N is small), tensor cores (swap AB) above")
