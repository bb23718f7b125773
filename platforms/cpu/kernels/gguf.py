"""Native GGUF dequantize (Q4_0/Q4_1/Q8_0 -> fp32/bf16), and gguf_linear as dequantize + torch matmul."""

from __future__ import annotations

import torch

from engine.core.ops.gguf_quant import BLOCK, GGUF_QTYPES, gguf_dequantize, gguf_linear
from engine.platforms.cpu import _native

from ._common import DTYPE_CODE, PRIORITY, isa_note


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
    if dtype not in DTYPE_CODE:
        return f"output dtype {dtype} not supported (fp32, bf16)"
    return _raw_verdict(raw, qtype, cols)


def _dequant(raw: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    if raw.stride(1) != 1:  # the cached choice may meet a strided tensor: copy rather than misread
        raw = raw.contiguous()
    out = torch.empty((raw.shape[0], cols), dtype=dtype)
    _native.gguf_dequant(qtype, raw.data_ptr(), raw.stride(0), raw.shape[0], cols, out.data_ptr(), cols,
                         DTYPE_CODE[dtype])
    return out


def _supports_linear(x, raw, qtype, cols):
    if x.device.type != "cpu":
        return "x must be on the cpu device"
    if x.dtype not in DTYPE_CODE:
        return f"x dtype {x.dtype} not supported (fp32, bf16)"
    if x.dim() < 1 or x.shape[-1] != cols:
        return f"x must be [..., {cols}]"
    return _raw_verdict(raw, qtype, cols)


def _dequant_matmul(x, raw, qtype, cols):
    # Dequantizes the whole weight on every call: correct everywhere, fast only for prefill-sized M.
    return torch.nn.functional.linear(x, _dequant(raw, qtype, cols, x.dtype))


def register(registry) -> None:
    registry.register(gguf_dequantize, _dequant, name="native", supports=_supports_dequant, priority=PRIORITY,
                      note=isa_note())
    registry.register(gguf_linear, _dequant_matmul, name="dequant_matmul", supports=_supports_linear,
                      priority=PRIORITY,
                      note="native dequantize to x.dtype, then torch matmul; " + isa_note())
