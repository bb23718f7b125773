"""Building blocks shared by the model families: linear and embedding over plain or GGUF weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.ops.gguf_quant import gguf_dequantize, gguf_linear

from .weights import QuantizedWeight, Weight


def linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T (+ bias); GGUF-quantized weights go through the platform's quantized linear op."""
    if isinstance(w, QuantizedWeight):
        y = gguf_linear(x, w.raw, w.qtype, w.cols)
        return y if bias is None else y + bias
    return F.linear(x, w, bias)


def embed(ids: torch.Tensor, w: Weight, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of the embedding table, in ``dtype`` (quantized tables dequantize only those rows)."""
    if isinstance(w, QuantizedWeight):
        return gguf_dequantize(w.raw[ids], w.qtype, w.cols, dtype)
    return F.embedding(ids, w).to(dtype)


def out_features(w: Weight) -> int:
    return w.rows if isinstance(w, QuantizedWeight) else w.shape[0]
