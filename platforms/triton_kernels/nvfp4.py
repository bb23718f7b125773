"""NVFP4 in Triton: ``nvfp4_quantize`` (bit-exact with the reference) and ``nvfp4_linear`` as a W4A16 kernel that
keeps the weight packed (two e2m1 codes per byte) and dequantizes it in registers; plus the native FP4 path for
Blackwell (``torch._scaled_mm`` on ``float4_e2m1fn_x2`` operands), gated on the capability and torch.

Numerics (see core/ops/nvfp4.py for the contract):

* quantize: every step is the reference's, in the same order and rounding: ``(amax / 6) * gs`` with IEEE division
  (``tl.math.div_rn``; Triton's ``/`` on fp32 is approximate on NVIDIA), clamp at 448, round to e4m3 (done in integer
  arithmetic, ties to even, so no backend conversion rule is involved), one ``div_rn(gs, scale)`` per block, then
  comparisons against the e2m1 midpoints with the reference's tie rules. The outputs are bit-exact.
* linear: the weight stays packed; a code becomes fp16 bits ``sign << 15 | (code & 7) << 9`` = ``e2m1 * 2**-14`` exactly
  (code 1 is an fp16 subnormal) and a block scale ``scale * 2**-120`` as fp32 bits (the GEMV: ``scale * 2**-8`` as fp16
  bits, see the W4A16 section). ``e2m1 *
  scale`` has at most 6 significant bits and lies in [2**-10, 2688], so the dequantized weight is exact in fp16, bf16
  and fp32; the powers of two and ``1 / global_scale`` are applied once to the fp32 accumulator at the end.

Two W4A16 kernels: ``_gemv_kernel`` for M <= GEMV_MAX_M (CUDA cores; the weight is decoded once per call, by inline PTX
on the GPU, and used for every row of x; per-16-block partial sums scaled once per block; split-K when N is small),
and ``_dot_kernel`` above
(tensor cores, "swap AB": the dequantized weight tile [BLOCK_N, K step] is the left operand and x^T the right one, so a
handful of tokens pads to 16 columns rather than 64 rows).
"""

from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from engine.core.ops.nvfp4 import BLOCK, nvfp4_linear, nvfp4_linear_w4a4, nvfp4_quantize
from engine.platforms.triton_kernels import interpreting, sm_count

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

PRIORITY = 10  # above the reference; the native Blackwell path registers above this
NATIVE_PRIORITY = PRIORITY + 10

# Rows of x up to which the CUDA-core GEMV runs. Its cost grows with every row (an FMA per weight value per row), the
# tensor-core kernel's does not. H200, 2026-12-01 run i (4096x14336 / 14336x4096, bf16, benchmarks/gpu/quant_sweep.py
# defaults): the GEMV with the PTX decode 20.0 / 18.9 us at M = 2, 29.4 / 29.2 at M = 3, 29.5 / 29.4 at M = 4; the
# tensor-core kernel 32.8 / 33.6 at each of them.
GEMV_MAX_M = 4
# GEMV tile at M = 1: rows of W per program, 16-element blocks per loop step (BLOCK_B * 8 bytes of each row), warps,
# and the programs per SM below which the rows per program halve (down to GEMV_MIN_BLOCK_N) and then K is split.
# Run h / i (M = 1): 4096 x 14336 on 4 rows took 15.2 us unsplit, 16.1 on 2 rows, 18.1 split in two (the split-K
# reduce is a second launch); 14336 x 4096 15.5 us. The M = 2..4 tile (GEMV_MR_*, split below PROGRAMS_PER_SM) took
# 20.0 / 18.9 us at M = 2 against 21.7 / 20.1 with the M = 1 tile.
GEMV_BLOCK_N = 4
GEMV_BLOCK_B = 128
GEMV_WARPS = 4
GEMV_PROGRAMS_PER_SM = 4
GEMV_MIN_BLOCK_N = 2
GEMV_MR_BLOCK_N = 4
GEMV_MR_BLOCK_B = 64
GEMV_MR_WARPS = 2
# Tensor-core tile for M <= 16: rows of W per program, words (8 values) per K step, warps, pipelining stages, and
# K order (the decoded planes interleaved for one long dot: 100 -> 57 us). Larger M keeps the earlier tile.
DOT_BLOCK_N = 64
DOT_BLOCK_T = 16
DOT_WARPS = 4
DOT_STAGES = 3
DOT_KORDER = True
# bf16 / fp16 x: words decoded by inline PTX into scaled 16-bit pairs (DOT_ASM), and each block scale loaded once and
# widened to its two words (DOT_SBLK) instead of once per word. Together 57 -> 32.7 us (M = 4 and 16, 4096x14336):
# the per-word scale loads kept L1 at 88% (Nsight Compute, 2026-12-01).
DOT_ASM = True
DOT_SBLK = True
GEMV_STAGES = 2
GEMV_PREFETCH = False  # register double buffer of the next step's words and scales
GEMV_ASM = True  # the GEMV's words decoded by inline PTX (never under the interpreter, which runs the Triton decode)
# Programs wanted per SM before split-K stops adding splits. The measured 18%-of-bandwidth numbers came from too few
# bytes in flight: a GEMV program holds one 16 KB step (8 rows x 256 blocks x 8 bytes) and ~3 fit per SM (73 regs x
# 256 threads), so 4096 x 14336 ran 512 programs in 1.3 waves; the dot kernel ran 32 programs (N / 128) for 132 SMs.
PROGRAMS_PER_SM = 8  # GEMV at M = 2..4 (M = 1: GEMV_PROGRAMS_PER_SM): 4096 x 14336 -> 2 splits, 2048 programs
DOT_PROGRAMS_PER_SM = 4  # dot: 4096 x 14336 -> 14 splits x 32 = 448 programs; 14336 x 4096 -> 4 x 112 = 448
MIN_SPLIT_BLOCK_B = 32  # the smallest GEMV K step (in 16-element blocks) split-K shrinks to
INTERPRETER_SMS = 4  # a small fake SM count under the interpreter, so the split-K path runs in CI


# ----------------------------------------------------------------------------------------------------------------
# quantize


@triton.jit
def _e4m3_rne(v):
    """fp32 ``v`` in [0, 448] -> (e4m3fn bits as int32, the e4m3 value as fp32), round to nearest, ties to even."""
    bits = v.to(tl.int32, bitcast=True)
    # normal range (v >= 2**-6): keep 3 mantissa bits of the fp32, ties to even; a carry moves into the exponent
    r = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # & 0xFFF00000
    normal_bits = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)  # e4m3 exponent = fp32 exponent - 127 + 7
    normal_val = r.to(tl.float32, bitcast=True)
    # subnormal range (v < 2**-6): the nearest multiple of 2**-9, ties to even (8 * 2**-9 is 2**-6, bits 0x08)
    mant = (bits & 0x7FFFFF) | 0x800000
    shift = tl.minimum(14 - ((bits >> 23) - 127), 25)  # v = mant * 2**(e - 23), q = v * 2**9 = mant >> (14 - e)
    q = mant >> shift
    rem = mant & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    is_normal = v >= 0.015625
    return tl.where(is_normal, normal_bits, q), tl.where(is_normal, normal_val, q.to(tl.float32) * 0.001953125)


@triton.jit
def _e2m1_code(v):
    """Nearest e2m1 code (int32, 0..15) of fp32 ``v``: the reference's midpoints and tie rules, sign bit of v."""
    a = tl.abs(v)
    code = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
    code += (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return code | (sign << 3)


@triton.jit
def _quantize_kernel(x_ptr, gs_ptr, q_ptr, s_ptr, M, NB, stride_xm, stride_qm, stride_sm,
                     BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    blks = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    j = tl.arange(0, 8)
    mask2 = (rows[:, None] < M) & (blks[None, :] < NB)
    mask3 = mask2[:, :, None]
    rows64 = rows.to(tl.int64)
    col = blks[None, :, None] * 16 + 2 * j[None, None, :]  # the even element of each pair
    xp = x_ptr + rows64[:, None, None] * stride_xm + col
    xe = tl.load(xp, mask=mask3, other=0.0).to(tl.float32)
    xo = tl.load(xp + 1, mask=mask3, other=0.0).to(tl.float32)
    gs = tl.load(gs_ptr)
    amax = tl.maximum(tl.max(tl.abs(xe), axis=2), tl.max(tl.abs(xo), axis=2))
    scale_bits, scale = _e4m3_rne(tl.minimum(tl.math.div_rn(amax, 6.0) * gs, 448.0))
    inv = tl.where(scale == 0.0, 0.0, tl.math.div_rn(tl.zeros_like(scale) + gs, tl.where(scale == 0.0, 1.0, scale)))
    ce = _e2m1_code(xe * inv[:, :, None])
    co = _e2m1_code(xo * inv[:, :, None])
    tl.store(q_ptr + rows64[:, None, None] * stride_qm + blks[None, :, None] * 8 + j[None, None, :],
             (ce | (co << 4)).to(tl.uint8), mask=mask3)
    tl.store(s_ptr + rows64[:, None] * stride_sm + blks[None, :], scale_bits.to(tl.uint8), mask=mask2)


QUANT_BLOCK_M = 16
QUANT_BLOCK_B = 16


def quantize(x: torch.Tensor, global_scale: torch.Tensor):
    """nvfp4_quantize: x [M, K] -> (packed uint8 [M, K/2], block scales float8_e4m3fn [M, K/16])."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    nb = k // BLOCK
    packed = torch.empty((m, k // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((m, nb), dtype=torch.uint8, device=x.device)
    if m and nb:
        grid = (triton.cdiv(m, QUANT_BLOCK_M), triton.cdiv(nb, QUANT_BLOCK_B))
        _quantize_kernel[grid](x, global_scale.reshape(1), packed, scales, m, nb, x.stride(0), packed.stride(0),
                               scales.stride(0), BLOCK_M=QUANT_BLOCK_M, BLOCK_B=QUANT_BLOCK_B, num_warps=4)
    return packed, scales.view(torch.float8_e4m3fn)


def _same_device(t: torch.Tensor, device_type: str) -> bool:
    return t.device.type == device_type


def supports_quantize(device_type: str):
    def supports(x, global_scale):
        if not isinstance(x, torch.Tensor) or not _same_device(x, device_type):
            return f"x must be a tensor on {device_type}"
        if x.dtype not in X_DTYPES:
            return f"x dtype {x.dtype} not supported (fp32, bf16, fp16)"
        if x.dim() != 2 or x.shape[1] % BLOCK:
            return f"x must be [M, K] with K a multiple of {BLOCK}"
        if (not isinstance(global_scale, torch.Tensor) or global_scale.dtype != torch.float32
                or global_scale.numel() != 1 or global_scale.device != x.device):
            return "global_scale must be a one-element fp32 tensor on x's device"
        return True

    return supports


# ----------------------------------------------------------------------------------------------------------------
# W4A16 linear
#
# Both kernels read the packed weight as int32 words (8 codes each: word t of a row holds elements 8t .. 8t+7, element
# 8t+e in nibble e) and decode a word with a handful of 32-bit ops: the fp16 high byte of a code c = s.e1.e0.m is
# s.0000.e1.e0.m. (``(c & 7) << 1 | (c & 8) << 4``), built for the four low nibbles (``hl``) and the four high nibbles
# (``hh``) of a word at once, then paired two per int32 (``0xFF00FF00`` masks) and widened to fp32. Values are
# ``e2m1 * 2**-14`` exactly (code 1 is an fp16 subnormal). Block scales are decoded in 32-bit arithmetic too:
# ``(s & 0x7F) << 20`` read as fp32 is ``scale * 2**-120`` (an fp32 subnormal for e4m3 subnormals; Triton emits no
# flush-to-zero), times a power of two; the GEMV's as fp16 bits ``(s & 0x7F) << 7`` = ``scale * 2**-8`` (e4m3
# subnormals become fp16 subnormals), widened to fp32. Performance notes (sm_90 SASS, read with ptxas/cuobjdump on a
# CPU host, not timed): the GEMV loop ran ~6 instructions per weight value at M = 1 with the Triton decode and 16
# shared-memory layout conversions a step (Triton 3.6); now 284 a thread per 64 values (4 rows; 540 per 128 on 8
# rows), none through shared memory: 10 logic ops + 8 ``cvt.f32.f16`` per word (:func:`_asm_word_text`) and an FMA
# per value. The tensor-core loop (Triton 3.6) 560
# instructions per 64 values a thread with the Triton decode, 422 with the PTX one and once-per-block scales
# (``_decode_scaled_asm``: 2 shifts + 2 masks per pair and one packed multiply by the scale, no fp32 round trip).

_M80 = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as int32
_MFF = tl.constexpr(-0xFF0100)  # 0xFF00FF00 as int32


@triton.jit
def _f16_half(p, HIGH: tl.constexpr):
    """The low (or high) 16 bits of int32 ``p`` as fp16 bits, widened to fp32."""
    if HIGH:
        h = (p >> 16).to(tl.uint16)
    else:
        h = p.to(tl.uint16)
    return h.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _decode_words(w):
    """int32 words of 8 codes -> the 8 values ``e2m1 * 2**-14`` (fp32, exact), element order 0..7 of each word."""
    hl = ((w << 1) & 0x0E0E0E0E) | ((w << 4) & _M80)  # fp16 high bytes of the low nibbles: elements 0, 2, 4, 6
    hh = ((w >> 3) & 0x0E0E0E0E) | (w & _M80)  # ... of the high nibbles: elements 1, 3, 5, 7
    p04 = (hl << 8) & _MFF
    p26 = hl & _MFF
    p15 = (hh << 8) & _MFF
    p37 = hh & _MFF
    return (_f16_half(p04, False), _f16_half(p15, False), _f16_half(p26, False), _f16_half(p37, False),
            _f16_half(p04, True), _f16_half(p15, True), _f16_half(p26, True), _f16_half(p37, True))


@triton.jit
def _scale_bits(sb):
    """e4m3 scale bytes (int32) as fp32 ``scale * 2**-120`` (exact; subnormal below 2**-6 * 2**-120)."""
    return ((sb << 20) & 0x07F00000).to(tl.float32, bitcast=True)


def _asm_word_text() -> str:
    """PTX: int32 word $8 (8 codes) -> its 8 values ``e2m1 * 2**-14`` as fp32 $0..$7 (element order), exact. Six
    logic ops build the fp16 high bytes of all 8 codes (``sign << 7 | (code & 7) << 1``; low nibbles in ``hl``, high
    nibbles in ``hh``, each a bit select of two shifted copies of the word), two per byte pair move them into 16-bit
    halves with a zero low byte, and one ``cvt.f32.f16`` per value widens them (code 1 is an fp16 subnormal)."""
    sel = "0xE4"  # lop3 look-up table of c ? a : b
    return "\n".join([
        "{", ".reg .b32 g, s4, s1, hl, r3, hh, pa, pb, pc, pd;", ".reg .b16 l, h;",
        "and.b32 g, $8, 0x88888888;",  # the sign bits
        "shl.b32 s4, g, 4;",  # low-nibble signs to bit 7 of their byte
        "shl.b32 s1, $8, 1;",  # low-nibble e1.e0.m to bits 1..3
        f"lop3.b32 hl, s1, s4, 0x0E0E0E0E, {sel};",  # bytes: codes 0, 2, 4, 6
        "shr.u32 r3, $8, 3;",  # high-nibble e1.e0.m to bits 1..3; their signs are already at bit 7 in g
        f"lop3.b32 hh, r3, g, 0x0E0E0E0E, {sel};",  # bytes: codes 1, 3, 5, 7
        "prmt.b32 pb, hl, 0, 0x2404;", "and.b32 pa, hl, 0xFF00FF00;",  # codes (0, 4) and (2, 6)
        "prmt.b32 pd, hh, 0, 0x2404;", "and.b32 pc, hh, 0xFF00FF00;",  # codes (1, 5) and (3, 7)
        "mov.b32 {l, h}, pb;", "cvt.f32.f16 $0, l;", "cvt.f32.f16 $4, h;",
        "mov.b32 {l, h}, pd;", "cvt.f32.f16 $1, l;", "cvt.f32.f16 $5, h;",
        "mov.b32 {l, h}, pa;", "cvt.f32.f16 $2, l;", "cvt.f32.f16 $6, h;",
        "mov.b32 {l, h}, pc;", "cvt.f32.f16 $3, l;", "cvt.f32.f16 $7, h;",
        "}"])


_ASM_WORD = tl.constexpr(_asm_word_text())


@triton.jit
def _decode_word_f32(w, ASM: tl.constexpr):
    """int32 words -> 8 planes of fp32 ``e2m1 * 2**-14`` (element order); ASM: inline PTX, else Triton ops."""
    if ASM:
        return tl.inline_asm_elementwise(_ASM_WORD, "=f,=f,=f,=f,=f,=f,=f,=f,r", [w], dtype=(tl.float32,) * 8,
                                         is_pure=True, pack=1)
    else:
        return _decode_words(w)


@triton.jit
def _scale_f16(sb):
    """e4m3 scale bytes (uint8) -> fp32 ``scale * 2**-8``, exact: ``(s & 0x7F) << 7`` is that value's fp16 bits
    (e4m3 subnormals become fp16 subnormals)."""
    h = ((sb.to(tl.int32) & 0x7F) << 7).to(tl.int16)
    return h.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _x16(xq, DT: tl.constexpr):
    """8 bytes of x (int64, four 16-bit values) -> 4 fp32 values in element order."""
    lo = xq.to(tl.int32)
    hi = (xq >> 32).to(tl.int32)
    if DT == tl.bfloat16:  # bf16 bits are the top half of the fp32 bits
        return ((lo << 16).to(tl.float32, bitcast=True), (lo & -65536).to(tl.float32, bitcast=True),
                (hi << 16).to(tl.float32, bitcast=True), (hi & -65536).to(tl.float32, bitcast=True))
    else:
        return (lo.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
                (lo >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
                hi.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
                (hi >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32))


@triton.jit
def _ld(ptrs, mask):
    if mask is None:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=0)


@triton.jit
def _gemv_block(x_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7,
                X_SHIFT: tl.constexpr = False):
    """Sum over each 16-element block of one row of x times the decoded values (a: word 0, b: word 1 of the block,
    [BB, BN] each): [BB, BN]. ``blks`` and ``bmask`` (which may be None) are [BB, 1], so x is loaded straight into
    the layout it is used in (1-D x tensors took a shared-memory layout conversion each with Triton 3.6). 16-bit x
    is read as four 8-byte words per block and widened by bit ops. X_SHIFT: element e of each word (8 elements)
    is first multiplied by 2**-(4 e') with e' = 0, 1, 2, 3, 4, 1, 2, 3 (exact), for decoded values that carry
    2**(4 e') (int4_linear's mantissa decode); once per x value, shared by the block's rows."""
    DT: tl.constexpr = x_row.dtype.element_ty
    if DT == tl.float32:
        xb = x_row + blks * 16
        x0, x1, x2, x3 = _ld(xb, bmask), _ld(xb + 1, bmask), _ld(xb + 2, bmask), _ld(xb + 3, bmask)
        x4, x5, x6, x7 = _ld(xb + 4, bmask), _ld(xb + 5, bmask), _ld(xb + 6, bmask), _ld(xb + 7, bmask)
        x8, x9, x10, x11 = _ld(xb + 8, bmask), _ld(xb + 9, bmask), _ld(xb + 10, bmask), _ld(xb + 11, bmask)
        x12, x13, x14, x15 = _ld(xb + 12, bmask), _ld(xb + 13, bmask), _ld(xb + 14, bmask), _ld(xb + 15, bmask)
    else:
        xq = x_row.to(tl.pointer_type(tl.int64), bitcast=True) + blks * 4
        x0, x1, x2, x3 = _x16(_ld(xq, bmask), DT)
        x4, x5, x6, x7 = _x16(_ld(xq + 1, bmask), DT)
        x8, x9, x10, x11 = _x16(_ld(xq + 2, bmask), DT)
        x12, x13, x14, x15 = _x16(_ld(xq + 3, bmask), DT)
    if X_SHIFT:
        x1, x2, x3, x4, x5, x6, x7 = x1 * 0.0625, x2 * 0.00390625, x3 * 0.000244140625, x4 * 1.52587890625e-05, \
            x5 * 0.0625, x6 * 0.00390625, x7 * 0.000244140625
        x9, x10, x11, x12, x13, x14, x15 = x9 * 0.0625, x10 * 0.00390625, x11 * 0.000244140625, \
            x12 * 1.52587890625e-05, x13 * 0.0625, x14 * 0.00390625, x15 * 0.000244140625
    return (a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3 + a4 * x4 + a5 * x5 + a6 * x6 + a7 * x7 + b0 * x8 + b1 * x9
            + b2 * x10 + b3 * x11 + b4 * x12 + b5 * x13 + b6 * x14 + b7 * x15)  # one FMA chain per row and block


@triton.jit
def _gemv_load(w_rows, s_rows, blks, b_end, rmask, EVEN: tl.constexpr):
    """The [blocks, rows] tile's words (int64: both words of a block) and scale bytes; zeros where masked."""
    if EVEN:
        return tl.load(w_rows + blks), tl.load(s_rows + blks)
    else:
        m2 = (blks < b_end) & rmask[None, :]
        return tl.load(w_rows + blks, mask=m2, other=0), tl.load(s_rows + blks, mask=m2, other=0)


@triton.jit(do_not_specialize=["ZERO"])
def _gemv_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, out_ptr, part_ptr, M, N, NB, stride_xm, stride_wn, stride_sn,
                 stride_om, blocks_per_split, ZERO, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, ASM: tl.constexpr,
                 EVEN: tl.constexpr, PREFETCH: tl.constexpr = False):
    """CUDA-core GEMV for up to 4 rows of x. Tile [BLOCK_B blocks, BLOCK_N rows]: the K blocks spread over the lanes
    (one 8-byte load per row and block: the block's two words), the rows stay inside each thread so each x value is
    loaded and widened once and used for all of them; block sums are scaled once per block. ASM: the words are
    decoded by inline PTX (:func:`_asm_word_text`), else by Triton ops (the interpreter). Program (pid_n, pid_k)
    covers rows pid_n * BLOCK_N .. and blocks pid_k * blocks_per_split ..; with SPLIT, fp32 partials go to part_ptr
    [splits, M, N]. 16-bit x must be 8-byte aligned with a row stride that is a multiple of 4 (the host sees to it).
    EVEN: N is a multiple of BLOCK_N and every split a whole number of BLOCK_B steps, so no load is masked. ZERO
    is 0 (see the loop)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bb = tl.arange(0, BLOCK_B)
    rmask = rows < N
    rows64 = rows.to(tl.int64)
    w_rows = w_ptr.to(tl.pointer_type(tl.int64), bitcast=True) + rows64[None, :] * (stride_wn // 2)  # block words
    s_rows = s_ptr + rows64[None, :] * stride_sn
    b_start = pid_k * blocks_per_split
    b_end = tl.minimum(b_start + blocks_per_split, NB)
    acc0 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    # rows of x past M read row M - 1 again (in bounds, unmasked); their sums are never stored
    x1_row = x_ptr + tl.minimum(1, M - 1) * stride_xm
    x2_row = x_ptr + tl.minimum(2, M - 1) * stride_xm
    x3_row = x_ptr + tl.minimum(3, M - 1) * stride_xm
    # Tiles are [blocks, rows], and every load (the block's two words as one int64, its scale byte, x's four 8-byte
    # words) must come out one element per thread in one layout, the blocks over the lanes; each mismatch is a
    # shared-memory layout conversion with barriers in the loop (Triton 3.6 made 16). Adding ZERO, an unspecialized
    # argument, leaves the blocks contiguous (so Triton orders them first, where a tie is broken one way in 3.6 and
    # the other in 3.9) but of unknown alignment (so no load is vectorized).
    bb = bb[:, None] + ZERO
    if PREFETCH:  # the next step's words and scales are loaded before this step's math (a register double buffer)
        w_nx, sb_nx = _gemv_load(w_rows, s_rows, b_start + bb, b_end, rmask, False)
    for k0 in range(b_start, b_end, BLOCK_B):
        blks = k0 + bb
        if PREFETCH:
            w, sb = w_nx, sb_nx
            w_nx, sb_nx = _gemv_load(w_rows, s_rows, blks + BLOCK_B, b_end, rmask, False)
        else:
            w, sb = _gemv_load(w_rows, s_rows, blks, b_end, rmask, EVEN)
        bmask = None if EVEN else blks < b_end
        wa = w.to(tl.int32)  # elements 0..7 of the block
        wb = (w >> 32).to(tl.int32)  # 8..15
        s = _scale_f16(sb)  # scale * 2**-8
        a0, a1, a2, a3, a4, a5, a6, a7 = _decode_word_f32(wa, ASM)
        b0, b1, b2, b3, b4, b5, b6, b7 = _decode_word_f32(wb, ASM)
        acc0 += _gemv_block(x_ptr, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7) * s
        if BLOCK_M > 1:
            acc1 += _gemv_block(x1_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7,
                                b0, b1, b2, b3, b4, b5, b6, b7) * s
        if BLOCK_M > 2:
            acc2 += _gemv_block(x2_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7,
                                b0, b1, b2, b3, b4, b5, b6, b7) * s
            acc3 += _gemv_block(x3_row, blks, bmask, a0, a1, a2, a3, a4, a5, a6, a7,
                                b0, b1, b2, b3, b4, b5, b6, b7) * s
    f = tl.math.div_rn(4194304.0, tl.load(gs_ptr))  # undo the codes' 2**-14 and the scales' 2**-8; / global scale
    _gemv_store(acc0, 0, f, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)
    if BLOCK_M > 1:
        _gemv_store(acc1, 1, f, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)
    if BLOCK_M > 2:
        _gemv_store(acc2, 2, f, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)
        _gemv_store(acc3, 3, f, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS, SPLIT)


@triton.jit
def _gemv_store(acc, m, f, rows, rmask, M, N, pid_k, bias_ptr, out_ptr, part_ptr, stride_om, HAS_BIAS: tl.constexpr,
                SPLIT: tl.constexpr):
    res = tl.sum(acc, axis=0) * f  # acc [BLOCK_B, BLOCK_N]
    mask = rmask & (rows * 0 + m < M)
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + m).to(tl.int64) * N + rows, res, mask=mask)
    else:
        if HAS_BIAS:
            res += tl.load(bias_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * stride_om + rows, res.to(out_ptr.dtype.element_ty), mask=mask)


def _asm_decode_text(bf16: bool) -> str:
    """PTX: int32 word $8 (8 codes) and a 16-bit scale $9 -> the 8 scaled values $0..$7 (element order). Codes i and
    i + 4 become one 16-bit pair by two shifts and masks (sign to bit 15, e1.e0.m to the exponent's low bits and the
    mantissa's top bit: bf16 ``e2m1 * 2**-126``, fp16 ``e2m1 * 2**-14``, subnormal for code 1), then one packed
    multiply by the scale pair."""
    em_mask, em_shift = ("0x01C001C0", 6) if bf16 else ("0x0E000E00", 9)
    lines = ["{", ".reg .b32 a, b, h, s2;", "mov.b32 s2, {$9, $9};"]
    for i in range(4):
        sh = em_shift - 4 * i
        lines.append(f"shl.b32 a, $8, {sh};" if sh >= 0 else f"shr.b32 a, $8, {-sh};")
        lines.append(f"and.b32 a, a, {em_mask};")
        sg = 12 - 4 * i
        lines.append(f"shl.b32 b, $8, {sg};" if sg else "mov.b32 b, $8;")
        lines += ["and.b32 b, b, 0x80008000;", "or.b32 h, a, b;",
                  f"mul.rn.{'bf16x2' if bf16 else 'f16x2'} h, h, s2;", f"mov.b32 {{${i}, ${i + 4}}}, h;"]
    return "\n".join(lines + ["}"])


_ASM_BF16 = tl.constexpr(_asm_decode_text(True))
_ASM_F16 = tl.constexpr(_asm_decode_text(False))


@triton.jit
def _decode_scaled_asm(w, s16):
    """int32 words and 16-bit scales (x's dtype, from :func:`_asm_scale_factor`) -> 8 planes of scaled values."""
    if s16.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_ASM_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(_ASM_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, s16],
                                         dtype=(tl.float16,) * 8, is_pure=True, pack=1)


@triton.jit
def _asm_scale_factor(DT: tl.constexpr):
    """What the block scale is multiplied by before it becomes x's dtype: bf16 codes are ``e2m1 * 2**-126``, scaled
    by ``scale * 2**116`` (<= 448 * 2**116, inside bf16's range) to ``e2m1 * scale * 2**-10``; fp16 codes are
    ``e2m1 * 2**-14``, scaled by ``scale * 2**7`` (<= 57344) to ``e2m1 * scale * 2**-7``. Exact both ways (6
    significant bits, multiples of 2**-20 / 2**-17)."""
    if DT == tl.bfloat16:
        return 8.307674973655724e34  # 2**116
    else:
        return 128.0


@triton.jit
def _asm_unshift(DT: tl.constexpr):
    if DT == tl.bfloat16:
        return 1024.0
    else:
        return 128.0


@triton.jit
def _dot_step(acc, v, s, xp, xmask, DT: tl.constexpr, INTERPRET: tl.constexpr):
    a = (v * s).to(DT)  # e2m1 * scale * 2**-14: 6 significant bits, multiples of 2**-24: exact in bf16, fp16, fp32
    xt = tl.load(xp, mask=xmask, other=0.0)
    if INTERPRET:  # the interpreter's bf16 dot is wrong; fp32 tiles give the right answer
        return tl.dot(a.to(tl.float32), xt.to(tl.float32), acc)
    elif DT == tl.float32:
        return tl.dot(a, xt, acc, input_precision="ieee")
    else:
        return tl.dot(a, xt, acc)


@triton.jit
def _pair_dot(acc, lo, hi, xp, mmask, DT: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + [lo, hi interleaved along K] @ x^T rows at ``xp`` ([2 BLOCK_T, BLOCK_M] pointers): x's dtype operands,
    fp32 accumulation."""
    BN: tl.constexpr = lo.shape[0]
    T: tl.constexpr = lo.shape[1]
    a = tl.reshape(tl.join(lo.to(DT), hi.to(DT)), [BN, 2 * T])
    xt = tl.load(xp, mask=mmask[None, :], other=0.0)
    if INTERPRET:  # the interpreter's 16-bit dot is wrong; fp32 tiles (of the rounded values) are right
        acc = tl.dot(a.to(tl.float32), xt.to(tl.float32), acc)
    elif DT == tl.float32:
        acc = tl.dot(a, xt, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, xt, acc)
    return acc


@triton.jit
def _k_order(v0, v1, v2, v3, v4, v5, v6, v7):
    """Eight [BN, T] planes (plane e holds elements 8t + e) as one [BN, 8T] tile in element order."""
    BN: tl.constexpr = v0.shape[0]
    T: tl.constexpr = v0.shape[1]
    q0 = tl.join(tl.join(v0, v1), tl.join(v2, v3))  # [BN, T, e0, e1]
    q1 = tl.join(tl.join(v4, v5), tl.join(v6, v7))
    r = tl.permute(tl.join(q0, q1), (0, 1, 4, 3, 2))  # [BN, T, e2, e1, e0]
    return tl.reshape(r, [BN, 8 * T])


@triton.jit
def _dot_kernel(x_ptr, w_ptr, s_ptr, gs_ptr, bias_ptr, out_ptr, part_ptr, M, N, KW, stride_xm, stride_wn, stride_sn,
                stride_om, words_per_split, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, INTERPRET: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, KORDER: tl.constexpr,
                ASM: tl.constexpr = False, SBLK: tl.constexpr = False, PAIRS: tl.constexpr = False):
    """Tensor cores, swap AB: out^T tile [BLOCK_N, BLOCK_M] += W [BLOCK_N, K step] @ x^T [K step, BLOCK_M]. A K step
    is BLOCK_T words; it is eight dots, one per nibble position e, against the x^T rows 8t + e (the order of the terms
    of a dot product is free, so the codes are never interleaved back into K order). Program (pid_n, pid_m, pid_k)
    covers words pid_k * words_per_split ..; with SPLIT, fp32 partials (already times the final factor) go to
    part_ptr [splits, M, N] and _splitk_reduce_kernel sums them.

    ASM (bf16 / fp16 x, KORDER; never under the interpreter): the words are decoded by :func:`_decode_scaled_asm`
    straight into scaled 16-bit pairs. SBLK (KORDER only): the block scales are loaded once per block
    ([BLOCK_N, BLOCK_T / 2]) and widened to the words by a join, not loaded once per word. With the plane-wise dots
    (KORDER off) SBLK computed wrong results on the H200 (Triton 3.6, 2026-12-01; right under the interpreter), so
    the host never asks for that pair. PAIRS (x in :func:`plane_order`, splits of whole steps): four dots a step, each
    on the codes e and e + 4 of every word joined along K, against x^T's contiguous rows; with ASM those are the
    PTX's register pairs as they come."""
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
    x_cols = x_ptr + ms.to(tl.int64)[None, :] * stride_xm
    DT: tl.constexpr = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    t_start = pid_k * words_per_split
    t_end = tl.minimum(t_start + words_per_split, KW)
    for k0w in range(t_start, t_end, BLOCK_T):
        t = k0w + tt
        tmask = t < t_end
        m2 = rmask[:, None] & tmask[None, :]
        w = tl.load(w_rows + t[None, :], mask=m2, other=0)
        # the scale itself (2**120 undoes the bits' 2**-120); the codes keep their 2**-14
        if SBLK:  # one load per 16-element block (two words), widened to the words by a join
            bk = k0w // 2 + tl.arange(0, BLOCK_T // 2)
            sh = tl.load(s_rows + bk[None, :], mask=rmask[:, None] & (bk * 2 < t_end)[None, :], other=0)
            sh = _scale_bits(sh.to(tl.int32)) * 1.329227995784916e36
            s = tl.reshape(tl.join(sh, sh), [BLOCK_N, BLOCK_T])
        else:
            s = _scale_bits(tl.load(s_rows + (t // 2)[None, :], mask=m2, other=0).to(tl.int32)) * 1.329227995784916e36
        if PAIRS:
            # x comes in plane_order and every split is whole steps: four dots on the code pairs (e, e + 4) that one
            # register of the PTX decode holds, nothing interleaved (see int4_linear's PLANES)
            if ASM:
                p0, p1, p2, p3, p4, p5, p6, p7 = _decode_scaled_asm(w, (s * _asm_scale_factor(DT)).to(DT))
            else:
                p0, p1, p2, p3, p4, p5, p6, p7 = _decode_words(w)
                p0, p1, p2, p3, p4, p5, p6, p7 = p0 * s, p1 * s, p2 * s, p3 * s, p4 * s, p5 * s, p6 * s, p7 * s
            xq = x_cols + (k0w * 8 + tl.arange(0, 2 * BLOCK_T))[:, None]
            acc = _pair_dot(acc, p0, p4, xq, mmask, DT, INTERPRET)
            acc = _pair_dot(acc, p1, p5, xq + 2 * BLOCK_T, mmask, DT, INTERPRET)
            acc = _pair_dot(acc, p2, p6, xq + 4 * BLOCK_T, mmask, DT, INTERPRET)
            acc = _pair_dot(acc, p3, p7, xq + 6 * BLOCK_T, mmask, DT, INTERPRET)
        elif ASM:
            # planes of e2m1 * scale * 2**-10 (bf16) / 2**-7 (fp16), exact; see _asm_scale_factor
            p0, p1, p2, p3, p4, p5, p6, p7 = _decode_scaled_asm(w, (s * _asm_scale_factor(DT)).to(DT))
            kk = k0w * 8 + tl.arange(0, 8 * BLOCK_T)
            xmask = ((kk // 8) < t_end)[:, None] & mmask[None, :]  # constant over each word's 8: 16-byte loads
            xt = tl.load(x_cols + kk[:, None], mask=xmask, other=0.0)
            acc = tl.dot(_k_order(p0, p1, p2, p3, p4, p5, p6, p7), xt, acc)
        elif KORDER:
            v0, v1, v2, v3, v4, v5, v6, v7 = _decode_words(w)
            # the eight nibble planes interleaved back into K order: one K = 8 * BLOCK_T dot against x^T read
            # contiguously (the plane-wise dots read x^T at a stride of 8 elements, 2 useful bytes per sector)
            kk = k0w * 8 + tl.arange(0, 8 * BLOCK_T)
            xmask = (kk < t_end * 8)[:, None] & mmask[None, :]
            acc = _dot_step(acc, _k_order(v0, v1, v2, v3, v4, v5, v6, v7), _k_order(s, s, s, s, s, s, s, s),
                            x_cols + kk[:, None], xmask, DT, INTERPRET)
        else:
            v0, v1, v2, v3, v4, v5, v6, v7 = _decode_words(w)
            xp = x_cols + (t * 8)[:, None]
            xmask = tmask[:, None] & mmask[None, :]
            acc = _dot_step(acc, v0, s, xp, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v1, s, xp + 1, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v2, s, xp + 2, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v3, s, xp + 3, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v4, s, xp + 4, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v5, s, xp + 5, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v6, s, xp + 6, xmask, DT, INTERPRET)
            acc = _dot_step(acc, v7, s, xp + 7, xmask, DT, INTERPRET)
    if ASM:
        res = acc * tl.math.div_rn(_asm_unshift(DT), tl.load(gs_ptr))
    else:
        res = acc * tl.math.div_rn(16384.0, tl.load(gs_ptr))  # undo the codes' 2**-14, divide by the global scale
    omask = rmask[:, None] & mmask[None, :]
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + ms.to(tl.int64))[None, :] * N + rows[:, None], res, mask=omask)
    else:
        if HAS_BIAS:
            res += tl.load(bias_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + ms.to(tl.int64)[None, :] * stride_om + rows[:, None], res.to(out_ptr.dtype.element_ty),
                 mask=omask)


@triton.jit
def _splitk_reduce_kernel(part_ptr, bias_ptr, out_ptr, M, N, stride_om, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BLOCK: tl.constexpr):
    """out[m, n] = sum over s of part[s, m, n] (in split order: deterministic) + bias[n], in out's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for sp in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + sp * M * N + offs, mask=mask, other=0.0)
    rows = offs // N
    cols = offs % N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024


def splitk_reduce(part: torch.Tensor, bias, out: torch.Tensor) -> torch.Tensor:
    """One launch: out = part.sum(0) (+ bias, any strides), part [splits, M, N] fp32, out [M, N] with unit column
    stride."""
    splits, m, n = part.shape
    if bias is not None:
        bias = bias.contiguous()  # the kernel reads it densely (the kit's strided bias read every other value)
    _splitk_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
        part, bias if bias is not None else part, out, m, n, out.stride(0), SPLITS=splits, HAS_BIAS=bias is not None,
        BLOCK=REDUCE_BLOCK, num_warps=4)
    return out


def gemv_plan(n: int, nblocks: int, sms: int, block_n: int = GEMV_BLOCK_N, block_b: int = GEMV_BLOCK_B,
              programs_per_sm: int = PROGRAMS_PER_SM, min_split_block_b: int = MIN_SPLIT_BLOCK_B,
              splits: int | None = None):
    """(block_b, splits, blocks_per_split) for a GEMV over ``nblocks`` K blocks (the GGUF GEMV shares it). K is split
    only while the N programs alone leave SMs idle (fewer than ``programs_per_sm`` per SM), and then the K step
    shrinks (not below ``min_split_block_b``) to make pieces. ``splits`` (tuning) asks for that many pieces of
    whole ``block_b`` steps instead."""
    block_b = min(block_b, triton.next_power_of_2(nblocks))
    if splits is not None:
        per_split = triton.cdiv(triton.cdiv(nblocks, splits), block_b) * block_b
        return block_b, triton.cdiv(nblocks, per_split), per_split
    programs = triton.cdiv(n, block_n)
    target = programs_per_sm * sms
    splits = 1
    if programs < target:
        want = triton.cdiv(target, programs)
        block_b = max(min(block_b, triton.next_power_of_2(triton.cdiv(nblocks, want))),
                      min(block_b, min_split_block_b))
        splits = min(want, triton.cdiv(nblocks, block_b))
    per_split = triton.cdiv(triton.cdiv(nblocks, splits), block_b) * block_b
    return block_b, triton.cdiv(nblocks, per_split), per_split


def gemv_config(n: int, m: int, sms: int) -> tuple[int, int, int, int]:
    """The NVFP4 GEMV's default (block_n, block_b, num_warps, programs_per_sm) for N rows of W and M rows of x. M = 1:
    the GEMV_* tile, its rows per program halved (not below GEMV_MIN_BLOCK_N) while N / block_n programs leave fewer
    than GEMV_PROGRAMS_PER_SM per SM; :func:`gemv_plan` splits K below that. M > 1: the GEMV_MR_* tile, split below
    PROGRAMS_PER_SM."""
    if m > 1:
        return GEMV_MR_BLOCK_N, GEMV_MR_BLOCK_B, GEMV_MR_WARPS, PROGRAMS_PER_SM
    block_n = GEMV_BLOCK_N
    while block_n > GEMV_MIN_BLOCK_N and triton.cdiv(n, block_n) < GEMV_PROGRAMS_PER_SM * sms:
        block_n //= 2
    return block_n, GEMV_BLOCK_B, GEMV_WARPS, GEMV_PROGRAMS_PER_SM


def split_plan(programs: int, steps: int, step: int, sms: int, per_sm: int,
               splits: int | None = None) -> tuple[int, int]:
    """(splits, units_per_split) cutting ``steps`` K steps of ``step`` units each so that ``programs`` x splits
    reaches ``per_sm`` x ``sms`` (never an empty split); ``splits`` asks for that many instead (the benchmarks'
    sweeps; at most one a step). Shapes only, so it is capture-safe."""
    want = triton.cdiv(per_sm * sms, programs) if splits is None else int(splits)
    want = max(1, min(want, steps))
    per_split = triton.cdiv(steps, want) * step
    return triton.cdiv(steps * step, per_split), per_split


def plane_order(x: torch.Tensor, block_t: int) -> torch.Tensor:
    """x [M, K] with each run of 8 * block_t columns (one dot step) reordered for the plane-pair dots (this module's
    PAIRS, int4_linear's PLANES): the columns 8t + e and 8t + e + 4 (t < block_t, e < 4) go to 2 e block_t + 2 t and
    the one after. K must be whole steps."""
    m, k = x.shape
    return x.reshape(m, k // (8 * block_t), block_t, 2, 4).permute(0, 1, 4, 2, 3).reshape(m, k)


def dot_config(m: int, dtype: torch.dtype) -> dict:
    """Tensor-core tile for M rows of x (fp32 x, an IEEE fp32 dot, takes a smaller tile: the big one spills)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    if dtype == torch.float32:
        return dict(block_m=min(block_m, 64), block_n=64, block_t=16, num_warps=8, num_stages=2, korder=False)
    if block_m == 16:
        return dict(block_m=16, block_n=DOT_BLOCK_N, block_t=DOT_BLOCK_T, num_warps=DOT_WARPS, num_stages=DOT_STAGES,
                    korder=DOT_KORDER, asm=DOT_ASM, sblk=DOT_SBLK)
    if block_m <= 64:  # the K-ordered PTX tile widened (H200, 2026-12-07: 46.6 / 48.2 us at M = 64 on the 8B
        # MLP shapes against 134.6 / 131.6 for the plane-wise 64 x 128 tile; 32-row variants 58-106 us)
        return dict(block_m=64, block_n=128, block_t=16, num_warps=8, num_stages=3, korder=True, asm=True, sblk=True)
    return dict(block_m=block_m, block_n=128, block_t=16 if block_m == 128 else 32, num_warps=8, num_stages=3,
                korder=False)


def _words(w_packed: torch.Tensor) -> torch.Tensor:
    """The packed weight as int32 words [N, K/8] (K % 16 == 0, so rows are whole words); a weight whose storage is
    not 4-byte aligned (a view at an odd offset) is copied."""
    if w_packed.data_ptr() % 4:
        w_packed = w_packed.contiguous().clone()
    return w_packed.view(torch.int32)


def w4a16_linear(x, w_packed, w_block_scale, w_global_scale, bias=None, *, kernel: str | None = None, config=None):
    """nvfp4_linear, W4A16: out [M, N] = x @ dequant(w)^T (+ bias) in x.dtype. ``kernel`` ("gemv" or "dot") and
    ``config`` (block sizes, warps, stages, splits) override the heuristics; the benchmark uses them to tune."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = w_packed.shape[0]
    nb = k // BLOCK
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    words = _words(w_packed)
    gs = w_global_scale.reshape(1)
    scales = w_block_scale.view(torch.uint8)
    has_bias = bias is not None
    bias_arg = bias if has_bias else gs  # any pointer; not read
    cfg = dict(config or {})
    if kernel is None:
        kernel = "gemv" if m <= GEMV_MAX_M else "dot"
    if kernel == "gemv":
        if m > 4:
            raise ValueError(f"the GEMV kernel takes at most 4 rows of x, got {m}")
        sms = cfg.get("sms", sm_count(x.device, INTERPRETER_SMS))
        block_n, block_b, warps, per_sm = gemv_config(n, m, sms)
        block_n = cfg.get("block_n", block_n)
        block_b, splits, per_split = gemv_plan(n, nb, sms, block_n, cfg.get("block_b", block_b), per_sm,
                                               splits=cfg.get("splits"))
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
        if x.element_size() == 2 and (x.data_ptr() % 8 or (m > 1 and x.stride(0) % 4)):
            x = x.clone(memory_format=torch.contiguous_format)  # the kernel reads 16-bit x as 8-byte words
        if words.data_ptr() % 8:  # and a block's two words as one 8-byte word (rows are K/2 bytes, K % 16 == 0)
            words = words.clone()
        _gemv_kernel[(triton.cdiv(n, block_n), splits)](
            x, words, scales, gs, bias_arg, out, part, m, n, nb, x.stride(0), words.stride(0), scales.stride(0),
            out.stride(0), per_split, 0, HAS_BIAS=has_bias, SPLIT=splits > 1, BLOCK_M=triton.next_power_of_2(m),
            BLOCK_N=block_n, BLOCK_B=block_b, ASM=bool(cfg.get("asm", GEMV_ASM)) and not interpreting(),
            EVEN=n % block_n == 0 and nb % per_split == 0, PREFETCH=bool(cfg.get("prefetch", GEMV_PREFETCH)),
            num_warps=cfg.get("num_warps", warps), num_stages=cfg.get("num_stages", GEMV_STAGES))
        return splitk_reduce(part, bias, out) if splits > 1 else out
    dc = dot_config(m, x.dtype)
    dc.update(cfg)
    kw = k // 8
    programs = triton.cdiv(n, dc["block_n"]) * triton.cdiv(m, dc["block_m"])
    splits, per_split = split_plan(programs, triton.cdiv(kw, dc["block_t"]), dc["block_t"],
                                   cfg.get("sms", sm_count(x.device, INTERPRETER_SMS)), DOT_PROGRAMS_PER_SM,
                                   cfg.get("splits"))
    part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if splits > 1 else out
    pairs = bool(dc.get("pairs")) and kw % per_split == 0 and per_split % dc["block_t"] == 0
    if pairs:
        x = plane_order(x, dc["block_t"])
    korder = dc["korder"] and not pairs
    _dot_kernel[(triton.cdiv(n, dc["block_n"]), triton.cdiv(m, dc["block_m"]), splits)](
        x, words, scales, gs, bias_arg, out, part, m, n, kw, x.stride(0), words.stride(0), scales.stride(0),
        out.stride(0), per_split, HAS_BIAS=has_bias, SPLIT=splits > 1, INTERPRET=interpreting(),
        BLOCK_M=dc["block_m"], BLOCK_N=dc["block_n"], BLOCK_T=dc["block_t"], KORDER=korder,
        ASM=bool(dc.get("asm")) and (korder or pairs) and x.dtype in (torch.bfloat16, torch.float16)
        and not interpreting(),
        SBLK=bool(dc.get("sblk")) and korder,  # wrong with the plane-wise dots on the H200: see _dot_kernel
        PAIRS=pairs, num_warps=dc["num_warps"], num_stages=dc["num_stages"])
    return splitk_reduce(part, bias, out) if splits > 1 else out


def _linear_verdict(device_type, x, w_packed, w_block_scale, w_global_scale, bias):
    tensors = (x, w_packed, w_block_scale, w_global_scale)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "x, w_packed, w_block_scale and w_global_scale must be tensors"
    if not _same_device(x, device_type) or any(t.device != x.device for t in tensors[1:]):
        return f"all tensors must be on one {device_type} device"
    if x.dtype not in X_DTYPES:
        return f"x dtype {x.dtype} not supported (fp32, bf16, fp16)"
    if x.dim() != 2 or x.shape[1] % BLOCK:
        return f"x must be [M, K] with K a multiple of {BLOCK}"
    k = x.shape[1]
    if w_packed.dtype != torch.uint8 or w_packed.dim() != 2 or w_packed.shape[1] * 2 != k:
        return f"w_packed must be uint8 [N, K/2={k // 2}]"
    n = w_packed.shape[0]
    if w_block_scale.dtype != torch.float8_e4m3fn or tuple(w_block_scale.shape) != (n, k // BLOCK):
        return f"w_block_scale must be float8_e4m3fn [N={n}, K/16={k // BLOCK}]"
    if not (w_packed.is_contiguous() and w_block_scale.is_contiguous()):
        return "w_packed and w_block_scale must be contiguous"
    if w_global_scale.dtype != torch.float32 or w_global_scale.numel() != 1:
        return "w_global_scale must be a one-element fp32 tensor"
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.device != x.device or tuple(bias.shape) != (n,):
            return f"bias must be None or a [N={n}] tensor on x's device"
        if not bias.is_floating_point():
            return "bias must be floating point"
    return True


def supports_w4a16(device_type: str):
    def supports(x, w_packed, w_block_scale, w_global_scale, bias):
        return _linear_verdict(device_type, x, w_packed, w_block_scale, w_global_scale, bias)

    return supports


# ----------------------------------------------------------------------------------------------------------------
# native FP4 (Blackwell): torch._scaled_mm on float4_e2m1fn_x2


def native_fp4_available(capability, torch_module) -> tuple[bool, str]:
    """Whether the native NVFP4 GEMM can run: compute capability >= 10.0 (Blackwell's block-scaled FP4 tensor cores),
    a CUDA (not ROCm) torch, with ``float4_e2m1fn_x2`` and ``_scaled_mm``. Returns (ok, reason); pure, so it is tested
    anywhere with a stand-in torch module."""
    if capability is None:
        return False, "no compute capability (not a CUDA device)"
    if getattr(getattr(torch_module, "version", None), "hip", None):
        return False, "ROCm torch: the swizzled FP4 block-scale layout is cuBLAS's"
    cap = tuple(capability)
    if cap < (10, 0):
        return False, f"compute capability {cap[0]}.{cap[1]} < 10.0: no FP4 tensor cores (Hopper runs the W4A16 kernel)"
    missing = [a for a in ("float4_e2m1fn_x2", "_scaled_mm") if not hasattr(torch_module, a)]
    if missing:
        return False, f"torch {getattr(torch_module, '__version__', '?')} lacks {', '.join(missing)}"
    return True, f"compute capability {cap[0]}.{cap[1]} and torch._scaled_mm with float4_e2m1fn_x2"


def blocked_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [R, C] -> the flat layout cuBLAS wants for block-scaled FP4/FP8 GEMMs (torch's ``to_blocked``):
    R padded to 128 and C to 4 with zeros, then 128x4 tiles in row-major tile order, each stored as 32 x (4 x 4):
    element (r, c) of a tile sits at (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scales.shape
    rb, cb = triton.cdiv(rows, 128), triton.cdiv(cols, 4)
    padded = scales
    if (rows, cols) != (rb * 128, cb * 4):
        padded = torch.zeros((rb * 128, cb * 4), dtype=scales.dtype, device=scales.device)
        padded[:rows, :cols] = scales
    tiles = padded.view(rb, 128, cb, 4).permute(0, 2, 1, 3)  # [rb, cb, 128, 4]
    return tiles.reshape(rb * cb, 4, 32, 4).transpose(1, 2).reshape(-1).contiguous()


# Weights do not change between calls: keep their re-laid-out scales, keyed on the scale tensor's identity (checked
# through a weak reference, with its data pointer and version counter, so a replaced or in-place-updated tensor is
# seen). A WeakKeyDictionary cannot be used: it compares tensor keys with ==.
_BLOCKED_WEIGHT_SCALES: dict[int, tuple] = {}


def _weight_blocked_scales(w_block_scale: torch.Tensor) -> torch.Tensor:
    key = id(w_block_scale)
    hit = _BLOCKED_WEIGHT_SCALES.get(key)
    if (hit is not None and hit[0]() is w_block_scale and hit[1] == w_block_scale._version
            and hit[2] == w_block_scale.data_ptr()):
        return hit[3]
    blocked = blocked_scales(w_block_scale)
    ref = weakref.ref(w_block_scale, lambda _, key=key: _BLOCKED_WEIGHT_SCALES.pop(key, None))
    _BLOCKED_WEIGHT_SCALES[key] = (ref, w_block_scale._version, w_block_scale.data_ptr(), blocked)
    return blocked


def native_fp4_linear(x, x_gs, w_packed, w_block_scale, w_global_scale, bias=None):
    """``nvfp4_linear_w4a4`` on Blackwell: x is quantized to NVFP4 with its calibrated global scale (the Triton
    quantizer, bit-exact with the reference), then one block-scaled FP4 GEMM; the two global scales and the bias
    are applied to its bf16 output in fp32."""
    x_gs = x_gs.reshape(())
    xq, x_bs = quantize(x, x_gs)
    a = xq.view(torch.float4_e2m1fn_x2)
    b = w_packed.view(torch.float4_e2m1fn_x2).t()  # [K/2, N], column-major as _scaled_mm wants
    mm = torch._scaled_mm(a, b, blocked_scales(x_bs), _weight_blocked_scales(w_block_scale),
                          out_dtype=torch.bfloat16)
    out = mm.float() / (x_gs * w_global_scale.reshape(()))
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype)


def supports_native(device_type: str):
    def supports(x, x_global_scale, w_packed, w_block_scale, w_global_scale, bias):
        if x_global_scale.numel() != 1 or x_global_scale.dtype != torch.float32:
            return "x_global_scale must be a one-element float32 tensor"
        ok = _linear_verdict(device_type, x, w_packed, w_block_scale, w_global_scale, bias)
        if ok is not True:
            return ok
        k, n = x.shape[1], w_packed.shape[0]
        if k % 32 or n % 16:
            return "torch._scaled_mm FP4 needs K % 32 == 0 and N % 16 == 0"
        return True

    return supports


def register(registry, device_type: str, capability=None) -> None:
    registry.register(nvfp4_quantize, quantize, name="triton_nvfp4_quantize", supports=supports_quantize(device_type),
                      priority=PRIORITY, note="Triton, bit-exact with the reference")
    registry.register(nvfp4_linear, w4a16_linear, name="triton_nvfp4_w4a16", supports=supports_w4a16(device_type),
                      priority=PRIORITY,
                      note=f"Triton W4A16, packed weights dequantized in registers: CUDA-core GEMV for M <= "
                           f"{GEMV_MAX_M} (split-K when N is small), tensor cores (swap AB) above")
    if device_type != "cuda":  # not a candidate at all (xpu, or cpu under the interpreter): nothing to report
        return
    ok, why = native_fp4_available(capability, torch)
    if ok:
        registry.register(nvfp4_linear_w4a4, native_fp4_linear, name="native_fp4_scaled_mm",
                          supports=supports_native(device_type), priority=NATIVE_PRIORITY,
                          note="torch._scaled_mm on FP4 tensor cores; W4A4: activations quantized to NVFP4 per call")
    else:
        registry.skip(nvfp4_linear_w4a4, "native_fp4_scaled_mm", why)
        registry.reference_only(nvfp4_linear_w4a4, f"W4A4 needs FP4 tensor cores: {why}")
