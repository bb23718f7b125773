"""Building blocks shared by the model families: linear and embedding over plain or GGUF weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import gguf_dequantize, gguf_linear

from .weights import QuantizedWeight, Weight


def linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ bias); GGUF-quantized weights go through the platform's quantized linear op."""
    if isinstance(w, QuantizedWeight):
        op = gguf_linear_q8act if w.quantize_activations else gguf_linear
        y = op(x, w.raw, w.qtype, w.cols)
        return y if bias is None else y + bias
    return F.linear(x, w, bias)


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


def embed(ids: torch.Tensor, w: Weight, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of the embedding table, in ``dtype`` (quantized tables dequantize only those rows)."""
    if isinstance(w, QuantizedWeight):
        return gguf_dequantize(w.raw[ids], w.qtype, w.cols, dtype)
    return F.embedding(ids, w).to(dtype)


def out_features(w: Weight) -> int:
    return w.rows if isinstance(w, QuantizedWeight) else w.shape[0]
