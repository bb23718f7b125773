"""Building blocks shared by the model families: linear and embedding over plain or GGUF weights, one object per
call site (see CallSite)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import gguf_dequantize, gguf_linear
from engine.core.ops.linear import linear
from engine.core.ops.registry import CallSite

from .weights import QuantizedWeight, Weight


class Linear:
    """``linear`` at one call site of a model: ``self(key, x)`` with the step's shape key (see CallSite), so the
    kernel (the dense ``linear`` op's or a quantized one's) is looked up once per step shape instead of dispatched
    on every call. A platform with no dense kernel runs the op's reference, torch's F.linear."""

    __slots__ = ("w", "bias", "site", "raw", "qtype", "cols", "quantized")

    def __init__(self, w: Weight, bias: torch.Tensor | None = None):
        self.w, self.bias = w, bias
        self.quantized = isinstance(w, QuantizedWeight)
        if self.quantized:
            self.site = CallSite(gguf_linear_q8act if w.quantize_activations else gguf_linear)
            self.raw, self.qtype, self.cols = w.raw, w.qtype, w.cols
        else:
            self.site = CallSite(linear)

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return self.site(key, x, self.w, self.bias)
        y = self.site(key, x, self.raw, self.qtype, self.cols)
        return y if self.bias is None else y + self.bias


class Embedding:
    """``embed`` at one call site (see Linear)."""

    def __init__(self, w: Weight, dtype: torch.dtype):
        self.w, self.dtype = w, dtype
        self.site = CallSite(gguf_dequantize) if isinstance(w, QuantizedWeight) else None

    def __call__(self, key, ids: torch.Tensor) -> torch.Tensor:
        if self.site is None:
            return F.embedding(ids, self.w).to(self.dtype)
        return self.site(key, self.w.raw[ids], self.w.qtype, self.w.cols, self.dtype)


def stack_rows(*ws: Weight) -> Weight | None:
    """One matrix holding the rows of ``ws`` in order (several projections of the same x as one GEMM), or None
    when they cannot share one (a mix of plain and quantized weights, or of quantization types)."""
    if all(isinstance(w, torch.Tensor) for w in ws):
        return torch.cat(ws) if len({(w.shape[1], w.dtype) for w in ws}) == 1 else None
    if not all(isinstance(w, QuantizedWeight) for w in ws):
        return None
    first = ws[0]
    if any((w.qtype, w.cols, w.quantize_activations) != (first.qtype, first.cols, first.quantize_activations)
           for w in ws):
        return None
    return QuantizedWeight(torch.cat([w.raw for w in ws]), first.qtype, sum(w.rows for w in ws), first.cols,
                           first.quantize_activations)


def out_features(w: Weight) -> int:
    return w.rows if isinstance(w, QuantizedWeight) else w.shape[0]
