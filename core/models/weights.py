"""Weights as the models see them: plain tensors, or GGUF-quantized matrices kept in their blocks."""

from __future__ import annotations

import dataclasses
import logging
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


@dataclass
class Fp8Weight:
    """A [rows, cols] matrix kept in FP8 as W8A8 checkpoints store it, used through ops.fp8_linear once the
    activations are quantized too. ``q`` is float8 [rows, cols]; ``scale`` fp32 in fp8_linear's layouts ([] per
    tensor, [rows, 1] per channel, [ceil(rows/128), ceil(cols/128)] per 128x128 block). Activations: a static
    per-tensor ``input_scale``, else dynamic per token (``act_group`` 0) or per 1x128 group (``act_group`` 128)."""

    q: torch.Tensor
    scale: torch.Tensor
    act_group: int = 0
    input_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def granularity(self) -> str:
        if self.scale.numel() == 1:
            return "tensor"
        return "channel" if tuple(self.scale.shape) == (self.q.shape[0], 1) else "block"


@dataclass
class Nvfp4Weight:
    """A [rows, cols] matrix kept in NVFP4 as ModelOpt exports it, used through ops.nvfp4_linear (W4A16) or, where
    the platform has FP4 tensor cores, ops.nvfp4_linear_w4a4 with the checkpoint's calibrated activation scale.
    ``packed`` uint8 [rows, cols/2] (two e2m1 codes a byte, low nibble first), ``block_scale`` float8_e4m3fn
    [rows, cols/16], ``global_scale`` fp32 one element in the ops' convention (``1 / weight_scale_2``: the
    dequantized weight is ``e2m1 * block_scale / global_scale``), ``input_global_scale`` ``1 / input_scale``."""

    packed: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor
    input_global_scale: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)


@dataclass
class Int4Weight:
    """A [rows, cols] matrix kept as GPTQ / AWQ / compressed-tensors 4-bit codes with group scales, used through
    ops.int4_linear (layout in core/ops/int4.py: ``packed`` uint8 [rows, cols/2], ``scale`` [rows, G], ``zero``
    uint8 [rows, G] or None for symmetric weights). On platforms with no int4_linear kernel the model turns it into
    GGUF Q4_0 / Q4_1 blocks at load (:func:`int4_as_gguf`), which their native kernels run."""

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)


@dataclass
class Int8Weight:
    """A [rows, cols] matrix kept as 8-bit codes with group scales (GPTQ 8-bit, compressed-tensors W8A16, or GGUF
    Q8_0 blocks on platforms with an int8_linear kernel), used through ops.int8_linear (layout in core/ops/int8.py:
    ``codes`` uint8 [rows, cols], ``scale`` [rows, G], ``zero`` uint8 [rows, G] or None for symmetric weights, zero
    128). On platforms with no int8_linear kernel the model turns symmetric ones into GGUF Q8_0 blocks at load."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)


Weight = torch.Tensor | QuantizedWeight | Fp8Weight | Nvfp4Weight | Int4Weight | Int8Weight


def native_int4(weights: dict, quantize_activations: bool = False, dtype: torch.dtype | None = None) -> dict:
    """``weights`` with each 4- and 8-bit matrix in the form the active platform's kernels read. Where the platform
    has no int4_linear / int8_linear kernel (the CPU's native kernels read GGUF blocks), each Int4Weight / Int8Weight
    becomes GGUF blocks (:func:`int4_as_gguf`, :func:`int8_as_gguf`). Where it has one, each GGUF Q4_0 / Q8_0 matrix
    that a Linear multiplies by becomes an Int4Weight / Int8Weight with groups of 32 (the same numbers:
    :func:`gguf_as_int4`, :func:`gguf_as_int8`), unless ``quantize_activations`` asks for the GGUF kernels' Q8
    activations. The token embedding (rows looked up, and the lm_head where tied) and MoE experts (fused_moe_gguf)
    stay GGUF blocks. An 8-bit matrix with zero points has no GGUF form: with ``dtype`` it is expanded to that dtype
    (said once, at WARNING), else refused by name."""
    from engine.core.ops.gguf_quant import Q4_0, Q8_0
    from engine.core.ops.int4 import int4_linear
    from engine.core.ops.int8 import int8_linear
    from engine.core.ops.registry import active_registry

    registry = active_registry()
    has = {Int4Weight: bool(registry.implementations(int4_linear)),
           Int8Weight: bool(registry.implementations(int8_linear))}
    to_int = {Q4_0: (Int4Weight, gguf_as_int4), Q8_0: (Int8Weight, gguf_as_int8)}
    out, expanded = {}, []
    for name, w in weights.items():
        if isinstance(w, QuantizedWeight) and w.qtype in to_int and has[to_int[w.qtype][0]] \
                and not quantize_activations and name != "model.embed_tokens.weight" and ".experts." not in name:
            w = to_int[w.qtype][1](w)
        elif isinstance(w, Int8Weight) and not has[Int8Weight] and w.zero is not None and dtype is not None \
                and not bool((w.zero == 128).all()):
            w = dense_weight(w, dtype)
            expanded.append(name)
        elif isinstance(w, (Int4Weight, Int8Weight)) and not has[type(w)]:
            try:
                w = int4_as_gguf(w) if isinstance(w, Int4Weight) else int8_as_gguf(w)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from exc
        out[name] = w
    if expanded:
        logging.getLogger("engine").warning(
            "engine: %d 8-bit matrices with zero points (asymmetric) are expanded to %s: this platform has no "
            "int8_linear kernel and GGUF Q8_0 has no zero points", len(expanded), str(dtype).removeprefix("torch."))
    return out


def gguf_as_int8(w: QuantizedWeight) -> Int8Weight:
    """A GGUF Q8_0 matrix as an Int8Weight, exactly: each block of 32 is a group (its fp16 ``d`` the scale), each
    signed q the code ``q + 128`` (zero 128)."""
    from engine.core.ops.gguf_quant import BLOCK, Q8_0

    if w.qtype != Q8_0:
        raise ValueError(f"only GGUF Q8_0 blocks are INT8 groups exactly, got quantization type {w.qtype}")
    blocks = w.raw.reshape(w.rows, w.cols // BLOCK, 2 + BLOCK)
    scale = blocks[..., :2].contiguous().view(torch.float16).reshape(w.rows, -1)
    codes = (blocks[..., 2:] ^ 0x80).reshape(w.rows, w.cols)
    return Int8Weight(codes.contiguous(), scale.contiguous(), None, BLOCK)


def int8_as_gguf(w: Int8Weight) -> QuantizedWeight:
    """A symmetric Int8Weight as GGUF Q8_0 blocks of 32 (each group's scale repeated over its blocks, as fp16),
    exactly where the scales are fp16; weights with zero points have no GGUF form the CPU kernels read."""
    from engine.core.ops.gguf_quant import BLOCK, Q8_0

    n, k = w.shape
    if w.zero is not None and not bool((w.zero == 128).all()):
        raise ValueError("8-bit weights with zero points (asymmetric) have no GGUF form the CPU kernels read; run "
                         "this checkpoint on a platform with an int8_linear kernel, or load it with dequantize=True")
    _check_fp16_scales(w.scale)
    d = w.scale.to(torch.float16).repeat_interleave(w.group_size // BLOCK, dim=1)[:, :k // BLOCK]
    qs = (w.codes ^ 0x80).reshape(n, k // BLOCK, BLOCK)
    raw = torch.cat([d[..., None].view(torch.uint8), qs], dim=-1)
    return QuantizedWeight(raw.reshape(n, -1).contiguous(), Q8_0, n, k)


def _check_fp16_scales(scale: torch.Tensor) -> None:
    if scale.dtype != torch.float16 and not bool(((scale.float().abs() < 65504) &
                                                  (scale.float().abs() >= 2**-14)).all()):
        raise ValueError(f"{scale.dtype} group scales outside fp16's normal range cannot become GGUF blocks "
                         "(fp16 scales); run this checkpoint on a platform with an int4_linear / int8_linear kernel")


def gguf_as_int4(w: QuantizedWeight) -> Int4Weight:
    """A GGUF Q4_0 matrix as an Int4Weight, exactly: each block of 32 is a group (its fp16 ``d`` the scale, zero 8);
    the block's codes (element j in the low nibble of byte j, element j + 16 in the high one) repacked in K order."""
    from engine.core.ops.gguf_quant import BLOCK, Q4_0
    from engine.core.ops.int4 import pack_codes

    if w.qtype != Q4_0:
        raise ValueError(f"only GGUF Q4_0 blocks are INT4 groups exactly, got quantization type {w.qtype}")
    blocks = w.raw.reshape(w.rows, w.cols // BLOCK, 2 + BLOCK // 2)
    scale = blocks[..., :2].contiguous().view(torch.float16).reshape(w.rows, -1)
    qs = blocks[..., 2:]
    codes = torch.cat([qs & 0xF, qs >> 4], dim=-1).reshape(w.rows, w.cols)
    return Int4Weight(pack_codes(codes), scale.contiguous(), None, BLOCK)


def int4_as_gguf(w: Int4Weight) -> QuantizedWeight:
    """The same matrix as GGUF blocks of 32 (each group's scale repeated over its blocks): symmetric weights (every
    zero 8) as Q4_0, exactly; others as Q4_1 with ``m = -zero * scale`` rounded to fp16 (as the GPU kernels that
    read these checkpoints round ``(q - z) * s``). Scales are stored as fp16 (GGUF's scale type)."""
    from engine.core.ops.gguf_quant import BLOCK, Q4_0, Q4_1
    from engine.core.ops.nvfp4 import unpack

    n, k = w.shape
    _check_fp16_scales(w.scale)
    per_block = w.group_size // BLOCK
    s = w.scale.to(torch.float16)
    d = s.repeat_interleave(per_block, dim=1)[:, :k // BLOCK]  # [N, K / 32] (a last group may be partial)
    vals = unpack(w.packed).reshape(n, k // BLOCK, BLOCK)
    qs = vals[..., :16] | (vals[..., 16:] << 4)
    if w.zero is None or bool((w.zero == 8).all()):
        raw = torch.cat([d[..., None].view(torch.uint8), qs], dim=-1)
        qtype = Q4_0
    else:
        m = (-(w.zero.float() * s.float())).to(torch.float16).repeat_interleave(per_block, dim=1)[:, :k // BLOCK]
        raw = torch.cat([d[..., None].view(torch.uint8), m[..., None].view(torch.uint8), qs], dim=-1)
        qtype = Q4_1
    return QuantizedWeight(raw.reshape(n, -1).contiguous(), qtype, n, k)


def to_device(w: Weight, device: torch.device) -> Weight:
    """The weight on ``device`` (the same object when it is already there)."""
    if isinstance(w, QuantizedWeight):
        return w if w.raw.device == device else dataclasses.replace(w, raw=w.raw.to(device))
    if isinstance(w, Fp8Weight):
        if w.q.device == device:
            return w
        return dataclasses.replace(w, q=w.q.to(device), scale=w.scale.to(device), input_scale=None
                                   if w.input_scale is None else w.input_scale.to(device))
    if isinstance(w, Nvfp4Weight):
        if w.packed.device == device:
            return w
        return Nvfp4Weight(*(None if t is None else t.to(device) for t in (w.packed, w.block_scale, w.global_scale,
                                                                         w.input_global_scale)))
    if isinstance(w, Int4Weight):
        if w.packed.device == device:
            return w
        return dataclasses.replace(w, packed=w.packed.to(device), scale=w.scale.to(device),
                                   zero=None if w.zero is None else w.zero.to(device))
    if isinstance(w, Int8Weight):
        if w.codes.device == device:
            return w
        return dataclasses.replace(w, codes=w.codes.to(device), scale=w.scale.to(device),
                                   zero=None if w.zero is None else w.zero.to(device))
    return w if w.device == device else w.to(device)


def weight_bytes(w: Weight) -> int:
    """Bytes the weight holds in memory (quantized weights: their blocks or FP8 values and scales)."""
    if isinstance(w, QuantizedWeight):
        return w.raw.nbytes
    if isinstance(w, Fp8Weight):
        return w.q.nbytes + w.scale.nbytes + (0 if w.input_scale is None else w.input_scale.nbytes)
    if isinstance(w, Nvfp4Weight):
        return w.packed.nbytes + w.block_scale.nbytes + 8
    if isinstance(w, Int4Weight):
        return w.packed.nbytes + w.scale.nbytes + (0 if w.zero is None else w.zero.nbytes)
    if isinstance(w, Int8Weight):
        return w.codes.nbytes + w.scale.nbytes + (0 if w.zero is None else w.zero.nbytes)
    return w.nbytes


def dense_weight(w: Weight, dtype: torch.dtype) -> torch.Tensor:
    """The weight as a plain [rows, cols] tensor of ``dtype`` (quantized weights dequantized with their scales, by
    the ops' references), for the few places that transform a weight rather than multiply by it (MLA's absorbed
    up-projections)."""
    if isinstance(w, Fp8Weight):
        scale = w.scale.float()
        if w.granularity == "block":
            rows, cols = w.q.shape
            scale = scale.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        return (w.q.float() * scale).to(dtype)
    if isinstance(w, Nvfp4Weight):
        from engine.core.ops.nvfp4 import e2m1_decode, unpack

        scale = w.block_scale.float().repeat_interleave(16, dim=1) / w.global_scale.float().reshape(())
        return (e2m1_decode(unpack(w.packed)) * scale).to(dtype)
    if isinstance(w, Int4Weight):
        from engine.core.ops.int4 import dequantize_int4

        return dequantize_int4(w.packed, w.scale, w.zero, w.group_size).to(dtype)
    if isinstance(w, Int8Weight):
        from engine.core.ops.int8 import dequantize_int8

        return dequantize_int8(w.codes, w.scale, w.zero, w.group_size).to(dtype)
    if isinstance(w, QuantizedWeight):
        from engine.core.ops.gguf_quant import gguf_dequantize

        return gguf_dequantize.reference(w.raw, w.qtype, w.cols, dtype)
    return w.to(dtype)
