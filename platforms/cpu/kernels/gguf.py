"""Native GGUF dequantize (Q4_0/Q4_1/Q8_0 -> fp32/bf16), gguf_linear (a fused kernel that reads the GGUF blocks
directly for decode and small batches, dequantize + torch matmul as the fallback) and gguf_linear_q8act (x rounded
to Q8 blocks, integer block dots).

fp16 (the ppc platform's dtype) goes through the fp32 kernels: x widened once, y rounded to fp16 once, which is the
ops' own definition (fp32 dequantized weight, fp32 accumulation, one rounding to x.dtype); the kernels take no fp16
storage, and the conversions cost two passes over activations that are tiny beside the weight stream."""

from __future__ import annotations

import torch

from engine.core.ops.gguf_q8act import gguf_linear_q8act, q8_round
from engine.core.ops.gguf_quant import BLOCK, GGUF_QTYPES, gguf_dequantize, gguf_linear
from engine.platforms.cpu import _native

from ._common import DTYPE_CODE, PRIORITY, isa_note, rows_of

FP16 = torch.float16
ACTIVATION_DTYPES = (*DTYPE_CODE, FP16)  # fp16 through the fp32 kernels (see the module docstring)


def _raw_verdict(raw: torch.Tensor, qtype: int, cols: int):
    if raw.device.type != "cpu":
        return "raw must be on the cpu device"
    if qtype not in GGUF_QTYPES:
        return f"qtype {qtype} not supported (Q4_0=2, Q4_1=3, Q8_0=8)"
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        return "raw must be a 2-D uint8 tensor"
    if cols <= 0 or cols % BLOCK or raw.shape[1] != cols // BLOCK * GGUF_QTYPES[qtype][1]:
        return f"raw shape {list(raw.shape)} does not hold {cols} columns of {GGUF_QTYPES[qtype][0]}"
    if raw.stride(1) != 1:
        return "raw rows are not contiguous"
    return True


def _supports_dequant(raw, qtype, cols, dtype):
    if dtype not in ACTIVATION_DTYPES:
        return f"output dtype {dtype} not supported (fp32, bf16, fp16)"
    return _raw_verdict(raw, qtype, cols)


def _dequant(raw: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == FP16:  # fp32 values rounded once, as the reference
        return _dequant(raw, qtype, cols, torch.float32).to(FP16)
    if raw.stride(1) != 1:  # the cached choice may meet a strided tensor: copy rather than misread
        raw = raw.contiguous()
    out = torch.empty((raw.shape[0], cols), dtype=dtype)
    _native.gguf_dequant(qtype, raw.data_ptr(), raw.stride(0), raw.shape[0], cols, out.data_ptr(), cols,
                         DTYPE_CODE[dtype])
    return out


def _supports_linear(x, raw, qtype, cols):
    if x.device.type != "cpu":
        return "x must be on the cpu device"
    if x.dtype not in ACTIVATION_DTYPES:
        return f"x dtype {x.dtype} not supported (fp32, bf16, fp16)"
    if x.dim() < 1 or x.shape[-1] != cols:
        return f"x must be [..., {cols}]"
    return _raw_verdict(raw, qtype, cols)


def _dequant_matmul(x, raw, qtype, cols):
    # Dequantizes the whole weight on every call: correct everywhere, fast only for prefill-sized M.
    if x.dtype == FP16:
        return _dequant_matmul(x.float(), raw, qtype, cols).to(FP16)
    return torch.nn.functional.linear(x, _dequant(raw, qtype, cols, x.dtype))


# Above this many rows of x (prefill), dequantizing the whole weight and calling torch's GEMM wins:
# measured on the SmolLM2 Q4_1 shapes, the fused kernel is 1.3-2.7x faster up to M = 64 and
# 1.2-3x slower from M = 96 to 512 (its 4-row panels re-read x from L2 for every 4 weight rows).
FUSED_MAX_M = 64
# The same for the Q8-activation op, whose fallback rounds x to Q8 blocks with torch first (same codes, so the
# same result up to the order of the sums).
Q8ACT_MAX_M = 64


def _q8act_dequant_matmul(x, raw, qtype, cols):
    return torch.nn.functional.linear(q8_round(x), _dequant(raw, qtype, cols, torch.float32)).to(x.dtype)


def _native_linear(kernel: str, max_m: int, fallback):
    """A wrapper calling ``_native.<kernel>`` (a GGUF linear: csrc/gguf_linear.h or gguf_q8act.h) for up to
    ``max_m`` rows of x and ``fallback`` above. Lean on purpose: a decode step makes ~120 of these calls, and each
    microsecond here is ~0.1 ms a token. The kernel is looked up on the module at each call, as every wrapper
    does, so a CPU graph capture (platforms/cpu/graph.py) sees the call."""

    def linear(x, raw, qtype, cols):
        if x.dtype == FP16:
            return linear(x.float(), raw, qtype, cols).to(FP16)
        if x.is_contiguous():
            x2, m, xs = x, x.numel() // cols, cols
        else:
            x2, m, xs = rows_of(x)
        if m > max_m:
            return fallback(x, raw, qtype, cols)
        if raw.stride(1) != 1:  # not in the dispatch cache key: copy rather than misread
            raw = raw.contiguous()
        n = raw.shape[0]
        y = torch.empty(m, n, dtype=x.dtype)
        getattr(_native, kernel)(qtype, x2.data_ptr(), xs, m, cols, raw.data_ptr(), raw.stride(0), n, y.data_ptr(),
                                 n, DTYPE_CODE[x.dtype])
        return y if x.dim() == 2 else y.view(*x.shape[:-1], n)

    return linear


# Fused: every weight block is decoded once per call, in registers (M = 1) or into an L1-resident fp32 panel
# shared by all rows of x; fp32 math, x is never quantized.
_fused_linear = _native_linear("gguf_linear", FUSED_MAX_M, _dequant_matmul)
# Q8 activations: x rounded to Q8 blocks once per call, then integer block dots (VNNI/AVX2/SDOT).
_q8act_linear = _native_linear("gguf_linear_q8act", Q8ACT_MAX_M, _q8act_dequant_matmul)


def register(registry) -> None:
    registry.register(gguf_dequantize, _dequant, name="native", supports=_supports_dequant, priority=PRIORITY,
                      note=isa_note())
    registry.register(gguf_linear, _fused_linear, name="fused", supports=_supports_linear, priority=PRIORITY + 1,
                      note=f"native fused decode + fp32 FMA (M <= {FUSED_MAX_M}; larger M: dequant_matmul); "
                      + isa_note())
    registry.register(gguf_linear_q8act, _q8act_linear, name="native", supports=_supports_linear,
                      priority=PRIORITY,
                      note=f"native integer block dots ({_native.gguf_q8act_variant()} at registration; M > "
                      f"{Q8ACT_MAX_M}: torch quantize + GEMM)")
    registry.register(gguf_linear, _dequant_matmul, name="dequant_matmul", supports=_supports_linear,
                      priority=PRIORITY,
                      note="native dequantize to x.dtype, then torch matmul; " + isa_note())
