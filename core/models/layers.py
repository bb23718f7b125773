"""Building blocks shared by the model families: linear and embedding over plain or GGUF weights, one object per
call site (see CallSite)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.ops.fp8 import BLOCK_K, FP8_DTYPES, fp8_linear, fp8_max
from engine.core.ops.fp8_quant import fp8_quantize_per_token
from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import gguf_dequantize, gguf_linear
from engine.core.ops.int4 import int4_linear
from engine.core.ops.int8 import int8_linear
from engine.core.ops.linear import linear
from engine.core.ops.nvfp4 import nvfp4_linear, nvfp4_linear_w4a4
from engine.core.ops.registry import CallSite, active_registry

from .weights import Fp8Weight, Int4Weight, Int8Weight, Nvfp4Weight, QuantizedWeight, Weight


class Linear:
    """``linear`` at one call site of a model: ``self(key, x)`` with the step's shape key (see CallSite), so the
    kernel (the dense ``linear`` op's or a quantized one's) is looked up once per step shape instead of dispatched
    on every call. A platform with no dense kernel runs the op's reference, torch's F.linear."""

    __slots__ = ("w", "bias", "site", "raw", "qtype", "cols", "quantized", "fp8", "quant", "fp8_name", "nvfp4",
                 "w4a4", "use_w4a4", "_w4a4_for", "int4", "int8")

    def __init__(self, w: Weight, bias: torch.Tensor | None = None):
        self.w, self.bias = w, bias
        self.quantized = isinstance(w, QuantizedWeight)
        self.fp8 = isinstance(w, Fp8Weight)
        self.nvfp4 = isinstance(w, Nvfp4Weight)
        self.int4 = isinstance(w, Int4Weight)
        self.int8 = isinstance(w, Int8Weight)
        if self.int4:
            self.site = CallSite(int4_linear)
        elif self.int8:
            self.site = CallSite(int8_linear)
        elif self.nvfp4:
            self.site, self.w4a4, self._w4a4_for = CallSite(nvfp4_linear), CallSite(nvfp4_linear_w4a4), None
        elif self.quantized:
            self.site = CallSite(gguf_linear_q8act if w.quantize_activations else gguf_linear)
            self.raw, self.qtype, self.cols = w.raw, w.qtype, w.cols
        elif self.fp8:
            self.site = CallSite(fp8_linear)
            self.quant = CallSite(fp8_quantize_per_token) if w.input_scale is None else None
            self.fp8_name = next(name for name, d in FP8_DTYPES.items() if d == w.q.dtype)  # once, not per step
        else:
            self.site = CallSite(linear)

    def __call__(self, key, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            return self._fp8(key, x)
        if self.nvfp4:
            return self._nvfp4(key, x)
        if self.int4:
            w = self.w
            return self.site(key, x, w.packed, w.scale, w.zero, w.group_size, self.bias)
        if self.int8:
            w = self.w
            return self.site(key, x, w.codes, w.scale, w.zero, w.group_size, self.bias)
        if not self.quantized:
            return self.site(key, x, self.w, self.bias)
        y = self.site(key, x, self.raw, self.qtype, self.cols)
        return y if self.bias is None else y + self.bias

    def _fp8(self, key, x: torch.Tensor) -> torch.Tensor:
        w = self.w
        if self.quant is not None:  # dynamic: one scale per token or per 1x128 group, from the activations
            x_q, x_scale = self.quant(key, x, self.fp8_name, w.act_group)
        else:  # static: the checkpoint's calibrated per-tensor scale
            x_q, x_scale = quantize_static(x, w.input_scale, w.q.dtype), w.input_scale
        return self.site(key, x_q, x_scale, w.q, w.scale, self.bias, x.dtype)


    def _nvfp4(self, key, x: torch.Tensor) -> torch.Tensor:
        """W4A4 (activations quantized with the checkpoint's input scale) where the platform has a kernel for it
        (FP4 tensor cores), else W4A16 on the dequantized weight, as vLLM runs NVFP4 checkpoints on other GPUs."""
        w = self.w
        registry = active_registry()
        if self._w4a4_for != (registry, registry.epoch):
            args = (x, w.input_global_scale, w.packed, w.block_scale, w.global_scale, self.bias)
            chosen = w.input_global_scale is not None and next(
                i for i, why in registry.explain(nvfp4_linear_w4a4, args) if why is None)
            self._w4a4_for = (registry, registry.epoch)
            self.use_w4a4 = chosen not in (False, nvfp4_linear_w4a4.reference_impl)
        if self.use_w4a4:
            return self.w4a4(key, x, w.input_global_scale, w.packed, w.block_scale, w.global_scale, self.bias)
        return self.site(key, x, w.packed, w.block_scale, w.global_scale, self.bias)


class Embedding:
    """``embed`` at one call site (see Linear)."""

    def __init__(self, w: Weight, dtype: torch.dtype):
        self.w, self.dtype = w, dtype
        self.site = CallSite(gguf_dequantize) if isinstance(w, QuantizedWeight) else None

    def __call__(self, key, ids: torch.Tensor) -> torch.Tensor:
        if self.site is None:
            return F.embedding(ids, self.w).to(self.dtype)
        # index_select, not raw[ids]: torch's advanced indexing runs on its OpenMP pool from ~8 rows, and the pool's
        # threads then spin through the next kernels, against the CPU platform's own threads (verify steps of 10
        # rows: their linear layers 1.9x slower on 2 cores).
        rows = self.w.raw.index_select(0, ids.reshape(-1))
        return self.site(key, rows, self.w.qtype, self.w.cols, self.dtype).view(*ids.shape, self.w.cols)


def stack_rows(*ws: Weight) -> Weight | None:
    """One matrix holding the rows of ``ws`` in order (several projections of the same x as one GEMM), or None
    when they cannot share one (a mix of plain and quantized weights, or of quantization types)."""
    if all(isinstance(w, torch.Tensor) for w in ws):
        return torch.cat(ws) if len({(w.shape[1], w.dtype) for w in ws}) == 1 else None
    if all(isinstance(w, Fp8Weight) for w in ws):
        return stack_fp8(ws)
    if all(isinstance(w, Nvfp4Weight) for w in ws):
        return stack_nvfp4(ws)
    if all(isinstance(w, Int4Weight) for w in ws):
        return stack_int4(ws)
    if all(isinstance(w, Int8Weight) for w in ws):
        return stack_int8(ws)
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


def stack_int4(ws) -> Int4Weight | None:
    return _stack_groups(ws, "packed", 8)


def stack_int8(ws) -> Int8Weight | None:
    return _stack_groups(ws, "codes", 128)


def _stack_groups(ws, codes: str, mid: int):
    """4- or 8-bit group-quantized matrices as one where they share K, group size and scale dtype; symmetric ones
    among asymmetric ones get their zero points (``mid``: 8 or 128) written out."""
    first = ws[0]
    if any((w.shape[1], w.group_size, w.scale.dtype) != (first.shape[1], first.group_size, first.scale.dtype)
           for w in ws):
        return None
    zero = None
    if any(w.zero is not None for w in ws):
        zero = torch.cat([w.zero if w.zero is not None else torch.full_like(w.scale, mid, dtype=torch.uint8)
                          for w in ws])
    return type(first)(torch.cat([getattr(w, codes) for w in ws]), torch.cat([w.scale for w in ws]), zero,
                       first.group_size)


def quantize_static(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """x quantized with a given per-tensor scale (a checkpoint's static input_scale), saturating at +-fp8_max."""
    top = fp8_max(fp8_dtype)
    return (x.float() / scale).clamp(-top, top).to(fp8_dtype)


def stack_fp8(ws) -> Fp8Weight | None:
    """FP8 matrices as one: per-channel scales (per-tensor ones become per-channel, exactly) or 128x128 blocks
    whose row blocks do not straddle two matrices; the activations must be quantized alike."""
    first = ws[0]
    if any((w.q.dtype, w.q.shape[1], w.act_group) != (first.q.dtype, first.q.shape[1], first.act_group) for w in ws):
        return None
    if any((w.input_scale is None) != (first.input_scale is None) for w in ws):
        return None
    if first.input_scale is not None and any(not torch.equal(w.input_scale, first.input_scale) for w in ws):
        return None
    kinds = {w.granularity for w in ws}
    if kinds <= {"tensor", "channel"}:
        scale = torch.cat([w.scale.reshape(1, 1).expand(w.q.shape[0], 1) if w.granularity == "tensor" else w.scale
                           for w in ws])
    elif kinds == {"block"} and all(w.q.shape[0] % BLOCK_K == 0 for w in ws[:-1]):
        scale = torch.cat([w.scale for w in ws])
    else:
        return None
    return Fp8Weight(torch.cat([w.q for w in ws]), scale.contiguous(), first.act_group, first.input_scale)


def stack_nvfp4(ws) -> Nvfp4Weight | None:
    """NVFP4 matrices as one where they share their per-tensor and input scales (ModelOpt calibrates q/k/v and
    gate/up alike in most checkpoints; where not, they stay separate GEMMs)."""
    first = ws[0]
    same = all(torch.equal(w.global_scale, first.global_scale) and w.packed.shape[1] == first.packed.shape[1]
               and (w.input_global_scale is None) == (first.input_global_scale is None)
               and (w.input_global_scale is None or torch.equal(w.input_global_scale, first.input_global_scale))
               for w in ws)
    if not same:
        return None
    return Nvfp4Weight(torch.cat([w.packed for w in ws]), torch.cat([w.block_scale for w in ws]), first.global_scale,
                       first.input_global_scale)
