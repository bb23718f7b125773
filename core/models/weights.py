"""Weights as the models see them: plain tensors, or GGUF-quantized matrices kept in their blocks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class QuantizedWeight:
    """A [rows, cols] matrix stored as GGUF blocks: ``raw`` is uint8 [rows, row_bytes] of type ``qtype``
    (a gguf.GGMLQuantizationType value: Q4_0, Q4_1 or Q8_0). Used through ops.gguf_linear / gguf_dequantize;
    with ``quantize_activations`` through ops.gguf_linear_q8act (x rounded to Q8 blocks, integer dot products)."""

    raw: torch.Tensor
    qtype: int
    rows: int
    cols: int
    quantize_activations: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)


Weight = torch.Tensor | QuantizedWeight


def to_device(w: Weight, device: torch.device) -> Weight:
    """The weight on ``device`` (the same object when it is already there)."""
    if isinstance(w, QuantizedWeight):
        return w if w.raw.device == device else dataclasses.replace(w, raw=w.raw.to(device))
    return w if w.device == device else w.to(device)
