"""Native GGUF dequantize (Q4_0/Q4_1/Q8_0 and the K-quants Q4_K/Q5_K/Q6_K -> fp32/bf16), gguf_linear (a fused
kernel for decode and small batches,
dequantize + torch matmul as the fallback) and gguf_linear_q8act (x rounded to Q8 blocks, integer block dots). On x86
and the portable ISA both linears read a row-interleaved copy of the weight (one copy per weight, whichever op runs
it: see _packed_weight); NEON, VSX and RVV read the GGUF blocks directly.

fp16 (the ppc platform's dtype) goes through the fp32 kernels: x widened once, y rounded to fp16 once, which is the
ops' own definition (fp32 dequantized weight, fp32 accumulation, one rounding to x.dtype); the kernels take no fp16
storage, and the conversions cost two passes over activations that are tiny beside the weight stream."""

from __future__ import annotations

import threading
import weakref

import torch

from engine.core.ops.gguf_kquants import K_QTYPES
from engine.core.ops.gguf_q8act import gguf_linear_q8act, q8_round
from engine.core.ops.gguf_quant import ALL_QTYPES, GGUF_QTYPES, gguf_dequantize, gguf_linear
from engine.platforms.cpu import _native

from ._common import DTYPE_CODE, PRIORITY, isa_note, rows_of
from .onednn_gemm import fp32_linear, onednn_active

FP16 = torch.float16
ACTIVATION_DTYPES = (*DTYPE_CODE, FP16)  # fp16 through the fp32 kernels (see the module docstring)


def _raw_verdict(raw: torch.Tensor, qtype: int, cols: int, qtypes=GGUF_QTYPES):
    if raw.device.type != "cpu":
        return "raw must be on the cpu device"
    if qtype not in qtypes:
        return f"qtype {qtype} not supported ({', '.join(f'{ALL_QTYPES[q][0]}={q}' for q in qtypes)})"
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        return "raw must be a 2-D uint8 tensor"
    name, block, size = ALL_QTYPES[qtype]
    if cols <= 0 or cols % block or raw.shape[1] != cols // block * size:
        return f"raw shape {list(raw.shape)} does not hold {cols} columns of {name}"
    if raw.stride(1) != 1:
        return "raw rows are not contiguous"
    return True


def _supports_dequant(raw, qtype, cols, dtype):
    if dtype not in ACTIVATION_DTYPES:
        return f"output dtype {dtype} not supported (fp32, bf16, fp16)"
    return _raw_verdict(raw, qtype, cols, ALL_QTYPES)


def _dequant(raw: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype, scratch: bool = False) -> torch.Tensor:
    """``gguf_dequantize``. ``scratch``: into this thread's buffer for that size (``_scratch``), valid until the next
    such call of the same size: for a weight that is used once and dropped."""
    if dtype == FP16:  # fp32 values rounded once, as the reference
        return _dequant(raw, qtype, cols, torch.float32).to(FP16)
    if raw.stride(1) != 1:  # the cached choice may meet a strided tensor: copy rather than misread
        raw = raw.contiguous()
    shape = (raw.shape[0], cols)
    out = _scratch(shape, dtype) if scratch else torch.empty(shape, dtype=dtype)
    _native.gguf_dequant(qtype, raw.data_ptr(), raw.stride(0), raw.shape[0], cols, out.data_ptr(), cols,
                         DTYPE_CODE[dtype])
    return out


# Prefill dequantizes each weight into fp32 for one GEMM. A fresh tensor of a few MB comes from new pages (glibc maps
# large blocks and unmaps them when freed), and their first-touch faults made the dequantization 9-25x slower than
# into memory already touched (3072 x 576 Q4_1: 886 us, 8 GB/s written; 49152 x 576: 2.4 GB/s; 2-core Zen 5): 98 ms of
# a 512-token prefill. So each thread keeps one buffer per size it has dequantized (a model has a few) up to
# _SCRATCH_MAX_BYTES, never freed: a recorded CPU graph may hold its address.
_SCRATCH_MAX_BYTES = 256 << 20
_scratch_buffers = threading.local()


def _scratch(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    buffers = getattr(_scratch_buffers, "by_size", None)
    if buffers is None:
        buffers = _scratch_buffers.by_size = {}
    buf = buffers.get((shape, dtype))
    if buf is None:
        buf = torch.empty(shape, dtype=dtype)
        if shape[0] * shape[1] * dtype.itemsize <= _SCRATCH_MAX_BYTES:
            buffers[(shape, dtype)] = buf
    return buf


def _supports_linear(x, raw, qtype, cols, qtypes=GGUF_QTYPES):
    if x.device.type != "cpu":
        return "x must be on the cpu device"
    if x.dtype not in ACTIVATION_DTYPES:
        return f"x dtype {x.dtype} not supported (fp32, bf16, fp16)"
    if x.dim() < 1 or x.shape[-1] != cols:
        return f"x must be [..., {cols}]"
    return _raw_verdict(raw, qtype, cols, qtypes)


def _supports_kquant_linear(x, raw, qtype, cols):
    return _supports_linear(x, raw, qtype, cols, K_QTYPES)


def _supports_any_linear(x, raw, qtype, cols):
    return _supports_linear(x, raw, qtype, cols, ALL_QTYPES)


def _dequant_matmul(x, raw, qtype, cols):
    # Dequantizes the whole weight on every call, into a reused buffer (_scratch): correct everywhere, fast only for
    # prefill-sized M. fp32 goes through oneDNN (onednn_gemm.py), bf16 through torch's GEMM.
    if x.dtype == FP16:
        return _dequant_matmul(x.float(), raw, qtype, cols).to(FP16)
    return fp32_linear(x, _dequant(raw, qtype, cols, x.dtype, scratch=True))


# Above this many rows of x (prefill), dequantizing the whole weight and calling torch's GEMM wins on the Intel
# Xeon of sessions 5-6: measured on the SmolLM2 Q4_1 shapes, the fused kernel is 1.3-2.7x faster up to M = 64 and
# 1.2-3x slower from M = 96 to 512 (its 4-row panels re-read x from L2 for every 4 weight rows).
FUSED_MAX_M = 64


def _cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ('AuthenticAMD', 'GenuineIntel', ...); '' where there is none to read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# On AMD with AVX-512 and no oneDNN the crossover is elsewhere: on the 2-core Zen 5 host (2026-12-01) torch's own
# fp32 GEMM (MKL) runs at ~180-210 GFLOP/s, and the raw-row fused kernel (x in 126-row chunks, csrc/gguf_linear.cpp,
# ~330-400 GFLOP/s) beat dequantize + that GEMM 1.6-1.9x at every M from 65 to 2048 on the SmolLM2 layer shapes.
# With oneDNN (420-465 GFLOP/s there) the fallback wins from M = 65 on (onednn_gemm.py), as on Intel. Its AVX2
# variant, forced on the same CPU, lost to either fallback, so the rule is per ISA, read at each prefill-sized call
# (the ISA can change at run time).
FUSED_RAW_MAX_M = 2048 if _cpu_vendor() == "AuthenticAMD" else FUSED_MAX_M


def fused_raw_max_m() -> int:
    """Rows of x up to which the fp32 op runs the raw-row fused kernel now (above: dequantize + fp32 GEMM)."""
    return FUSED_RAW_MAX_M if _native.isa() == "avx512" and not onednn_active() else FUSED_MAX_M


# The same for the Q8-activation op, whose fallback rounds x to Q8 blocks with torch first (same codes, so the
# same result up to the order of the sums).
Q8ACT_MAX_M = 64
# The packed kernel (csrc/gguf_packed.h) reuses each loaded weight vector across 8 rows of x and takes whole
# 16-row groups per thread: on the 2-core Zen 5 host it beat the torch fallback (dequantize + fp32 GEMM) 3-6x at
# every M measured, up to 2048 (SmolLM2 Q4_1 / Q8_0 shapes, 2026-12-01). Above, the fallback (and on a many-core
# CPU with few 16-row groups per thread, the fallback may win earlier: not measured).
PACKED_MAX_M = 2048


def _q8act_dequant_matmul(x, raw, qtype, cols):
    return fp32_linear(q8_round(x), _dequant(raw, qtype, cols, torch.float32, scratch=True)).to(x.dtype)


# Row-interleaved copies of GGUF weights for the packed Q8-activation kernels (csrc/gguf_packed.h: 16 rows per
# vector, all their block scales in one load; a decode GEMV then streams memory instead of spending ~12-22
# instructions per block and row). Memory cost: one more copy of each weight's GGUF bytes (rows padded to 16),
# kept while the raw tensor lives (and its arena, below, while any copy in it does). Keyed on the raw tensor's
# identity, checked through a weak reference with its data pointer and (but for inference tensors) version
# counter; a WeakKeyDictionary would compare tensors with ==. The copy outlives any CPU graph recorded on it
# while the raw tensor lives (platforms/cpu/graph.py records the packed address).
_PACKED: dict[int, tuple] = {}
# The copies are views of arenas of at least _ARENA_BYTES on huge pages (csrc gguf_advise_huge_pages: the kernels
# stream DRAM ~8% faster than from 4 KB pages, a decode step measured). An arena lives while any copy in it does;
# its unused tail is address space only (never written, so never backed by memory).
_ARENA_BYTES = 64 << 20
_HUGE = 2 << 20
_arena: list = [None, 0]  # the current arena (uint8 tensor) and the offset of its free bytes


def _arena_bytes(nbytes: int) -> torch.Tensor:
    """nbytes of fresh arena memory, 64-byte aligned."""
    nbytes = -(-nbytes // 64) * 64
    arena, off = _arena
    if arena is None or off + nbytes > arena.numel():
        arena = torch.empty(max(_ARENA_BYTES, nbytes + _HUGE), dtype=torch.uint8)
        off = -arena.data_ptr() % _HUGE  # start on a huge-page boundary
        _native.gguf_advise_huge_pages(arena.data_ptr() + off, arena.numel() - off)
        _arena[0] = arena
    _arena[1] = off + nbytes
    return arena[off:off + nbytes]


def _packed_weight(raw: torch.Tensor, qtype: int, cols: int):
    """The packed copy of ``raw`` (made on first sight, by C++ threads: ~100 MB in well under a second), or None
    where the current ISA has no packed kernel (NEON, VSX, RVV: ``_native.gguf_packed_variant()`` is '')."""
    key = id(raw)
    hit = _PACKED.get(key)
    if (hit is not None and hit[0]() is raw and hit[1] == raw.data_ptr()
            and (hit[2] is None or hit[2] == raw._version)):
        return hit[3]
    packed = None
    if _native.gguf_packed_variant():
        n = raw.shape[0]
        packed = _arena_bytes(_native.gguf_packed_bytes(qtype, n, cols))
        _native.gguf_pack(qtype, raw.data_ptr(), raw.stride(0), n, cols, packed.data_ptr())
    ref = weakref.ref(raw, lambda _, key=key: _PACKED.pop(key, None))
    try:
        version = raw._version
    except RuntimeError:  # an inference tensor: no version counter (and changed in place only in inference mode)
        version = None
    _PACKED[key] = (ref, raw.data_ptr(), version, packed)
    return packed


def _packed_linear(raw_kernel: str, packed_kernel: str | None, packed_max_m: int, raw_max_m, fallback):
    """A wrapper calling ``_native.<packed_kernel>`` on the packed copy of the weight for up to ``packed_max_m`` rows
    of x; above, and where the ISA has no packed kernel (or ``packed_kernel`` is None), ``_native.<raw_kernel>`` (a
    GGUF linear: csrc/gguf_linear.h or gguf_q8act.h) on the raw rows for up to ``raw_max_m`` (an int, or a function
    giving it, called only then); else ``fallback``. The native packed
    call itself falls back to the raw rows when the ISA changed since packing to one without a packed kernel.
    Lean on purpose: a decode step makes ~120 of these calls, and each microsecond here is ~0.1 ms a token. Kernels
    are looked up on the module at each call, so a CPU graph capture (platforms/cpu/graph.py) sees the call."""
    raw_limit = raw_max_m if callable(raw_max_m) else lambda: raw_max_m

    def linear(x, raw, qtype, cols):
        if x.dtype == FP16:
            return linear(x.float(), raw, qtype, cols).to(FP16)
        if x.is_contiguous():
            x2, m, xs = x, x.numel() // cols, cols
        else:
            x2, m, xs = rows_of(x)
        if m > packed_max_m and m > raw_limit():
            return fallback(x, raw, qtype, cols)
        if raw.stride(1) != 1:  # not in the dispatch cache key: copy rather than misread
            raw = raw.contiguous()
        packed = _packed_weight(raw, qtype, cols) if packed_kernel is not None and m <= packed_max_m else None
        if packed is None and m > raw_limit():
            return fallback(x, raw, qtype, cols)
        n = raw.shape[0]
        y = torch.empty(m, n, dtype=x.dtype)
        args = (qtype, x2.data_ptr(), xs, m, cols, raw.data_ptr(), raw.stride(0), n, y.data_ptr(), n,
                DTYPE_CODE[x.dtype])
        if packed is None:
            getattr(_native, raw_kernel)(*args)
        else:
            getattr(_native, packed_kernel)(*args, packed.data_ptr())
        return y if x.dim() == 2 else y.view(*x.shape[:-1], n)

    return linear


# Q8 activations through the packed copy (M <= PACKED_MAX_M), on the raw rows where the ISA has none (M <=
# Q8ACT_MAX_M), else torch quantize + GEMM.
_q8act_packed_linear = _packed_linear("gguf_linear_q8act", "gguf_linear_q8act_packed", PACKED_MAX_M, Q8ACT_MAX_M,
                                      _q8act_dequant_matmul)


# Fused: every weight block is decoded once per call, in registers (M = 1) or into an L1-resident fp32 panel
# shared by all rows of x; fp32 math, x is never quantized. Where the ISA has a packed kernel, _packed_fused_linear
# below reads the packed copy instead (this one stays the kernel on the raw rows).
_fused_linear = _packed_linear("gguf_linear", None, FUSED_MAX_M, FUSED_MAX_M, _dequant_matmul)


# gguf_linear through the packed copy (csrc/gguf_packed_f32_impl.h: fp32 x, never quantized; the same copy and cache
# as gguf_linear_q8act's) for M <= FUSED_MAX_M; above, and where the ISA has no packed kernel, the raw-row fused
# kernel up to fused_raw_max_m(); dequantize + torch matmul above that.
_packed_fused_linear = _packed_linear("gguf_linear", "gguf_linear_packed", FUSED_MAX_M, fused_raw_max_m,
                                      _dequant_matmul)


def register(registry) -> None:
    registry.register(gguf_dequantize, _dequant, name="native", supports=_supports_dequant, priority=PRIORITY,
                      note=isa_note())
    packed_f32 = _native.gguf_packed_f32_variant()
    registry.register(gguf_linear, _packed_fused_linear, name="fused", supports=_supports_linear,
                      priority=PRIORITY + 1,
                      note=f"native fused decode + fp32 FMA (M <= {FUSED_MAX_M}; larger M: dequantize + oneDNN fp32 "
                      f"GEMM, or without oneDNN torch's, or on AMD with AVX-512 the fused kernel to M = "
                      f"{FUSED_RAW_MAX_M}); "
                      + (f"row-interleaved weight copy, {packed_f32} at registration" if packed_f32 else isa_note()))
    packed = _native.gguf_packed_variant()
    registry.register(gguf_linear_q8act, _q8act_packed_linear, name="native", supports=_supports_linear,
                      priority=PRIORITY,
                      note="native integer block dots ("
                      + (f"row-interleaved weight copy, {packed}" if packed else _native.gguf_q8act_variant())
                      + f" at registration; M > {PACKED_MAX_M if packed else Q8ACT_MAX_M}: torch quantize + GEMM)")
    registry.register(gguf_linear, _fused_linear, name="kquant", supports=_supports_kquant_linear,
                      priority=PRIORITY + 1,
                      note="Q4_K/Q5_K/Q6_K: native super-block decode into fp32 panels + fp32 FMA (M <= "
                      f"{FUSED_MAX_M}; larger M: dequantize + oneDNN or torch GEMM); " + isa_note())
    registry.register(gguf_linear, _dequant_matmul, name="dequant_matmul", supports=_supports_any_linear,
                      priority=PRIORITY,
                      note="native dequantize to x.dtype, then oneDNN (fp32) or torch GEMM; " + isa_note())
