"""Quantized HF checkpoints, read as they are published and kept quantized: W8A8 FP8 here, GPTQ/AWQ 4-bit in
hf_int4.py.

- ``quant_method: "fp8"`` with ``weight_block_size: [128, 128]`` (DeepSeek-V3, Qwen3-FP8, transformers'
  FineGrainedFP8): float8_e4m3fn weights, ``weight_scale_inv`` per 128x128 block, activations quantized per 1x128
  group at run time.
- ``quant_method: "fbgemm_fp8"``: per-channel ``weight_scale`` [N, 1], activations per token.
- ``quant_method: "compressed-tensors"`` (the compressed-tensors package's schema, as RedHat / Neural Magic
  publish, ``format: float-quantized``): 8-bit float weights per tensor, per channel or per 128x128 block
  (``weight_scale``); activations dynamic per token or per 128-group, or static per tensor (``input_scale``).

A matrix quantized this way becomes an :class:`Fp8Weight` under its ``.weight`` name; what a checkpoint leaves
unquantized (``ignore`` / ``modules_to_not_convert``, e.g. lm_head) stays a plain tensor. Anything else quantized
is refused by name, never expanded silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.models.weights import Fp8Weight

from .errors import ModelLoadError

SUPPORTED = ("fp8 (128x128 blocks), fbgemm_fp8, compressed-tensors float-quantized W8A8 and pack-quantized W4A16, "
             "gptq and awq 4-bit, modelopt NVFP4 and FP8, quark OCP MXFP4 and FP8")
_SCALE_SUFFIXES = ("weight_scale", "weight_scale_inv", "input_scale", "input_scale_ub", "k_scale", "v_scale")


@dataclass
class Fp8Scheme:
    """How a checkpoint's FP8 matrices are stored: the name of their weight scale, and how activations are
    quantized (``act_group`` 0 per token, 128 per 1x128 group; ``static``: the checkpoint's per-tensor
    input_scale)."""

    scale_name: str
    act_group: int = 0
    static: bool = False
    description: str = ""

    def keeps(self, name: str, t: torch.Tensor) -> bool:
        """True for tensors that must keep their stored dtype (FP8 values, fp32 scales)."""
        return t.element_size() == 1 and t.is_floating_point() or name.rsplit(".", 1)[-1] in _SCALE_SUFFIXES

    def pack(self, weights: dict[str, torch.Tensor], source: str) -> dict:
        """``weights`` with each FP8 matrix and its scales as one Fp8Weight (KV-cache scales dropped: the cache
        is kept in the model's dtype)."""
        out = {}
        for name, t in weights.items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in _SCALE_SUFFIXES:
                continue
            if not (t.is_floating_point() and t.element_size() == 1):
                out[name] = t
                continue
            base = name.removesuffix("weight")
            scale = weights.get(base + self.scale_name)
            if not name.endswith(".weight") or t.dim() != 2 or scale is None:
                raise ModelLoadError(f"{source}: {name} is {t.dtype} {list(t.shape)} without a {self.scale_name} "
                                     f"beside it; the checkpoint does not follow its quantization_config")
            input_scale = weights.get(base + "input_scale") if self.static else None
            if self.static and input_scale is None:
                raise ModelLoadError(f"{source}: {name} has no input_scale, which static activation quantization "
                                     "needs")
            out[name] = Fp8Weight(t, _scale_layout(scale.float(), t.shape, name, source), self.act_group,
                                  None if input_scale is None else input_scale.float().reshape(()))
        return out


def _scale_layout(scale: torch.Tensor, shape, name: str, source: str) -> torch.Tensor:
    """The scale in fp8_linear's layout: [] per tensor, [N, 1] per channel, [ceil(N/128), ceil(K/128)] blocks."""
    n, k = shape
    if scale.numel() == 1:
        return scale.reshape(())
    if scale.numel() == n and (scale.dim() == 1 or scale.shape[-1] == 1):
        return scale.reshape(n, 1)
    blocks = (-(-n // 128), -(-k // 128))
    if tuple(scale.shape) == blocks:
        return scale
    raise ModelLoadError(f"{source}: the scale of {name} {list(shape)} is {list(scale.shape)}: neither per tensor, "
                         f"per channel [{n}, 1] nor per 128x128 block {list(blocks)}")


def quant_scheme(qc: dict, source: str):
    """How to read a checkpoint with this config.json ``quantization_config`` (an Fp8Scheme, or hf_int4's
    Int4Scheme for GPTQ/AWQ: both with ``keeps`` and ``pack``); ModelLoadError for what is not supported."""
    method = qc.get("quant_method")
    if method == "fp8":
        if list(qc.get("weight_block_size") or []) != [128, 128]:
            raise ModelLoadError(f"{source}: fp8 checkpoints are read with 128x128 weight blocks; this one has "
                                 f"weight_block_size {qc.get('weight_block_size')}")
        if qc.get("activation_scheme", "dynamic") != "dynamic":
            raise ModelLoadError(f"{source}: fp8 with activation_scheme {qc.get('activation_scheme')!r} is not "
                                 "supported (dynamic is)")
        return Fp8Scheme("weight_scale_inv", act_group=128, description="FP8 128x128 blocks, 1x128 activations")
    if method == "fbgemm_fp8":
        return Fp8Scheme("weight_scale", description="FP8 per channel, per-token activations")
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source)
    if method == "modelopt":
        from .hf_nvfp4 import modelopt_scheme

        return modelopt_scheme(qc, source)
    if method == "quark":
        from .hf_quark import quark_scheme

        return quark_scheme(qc, source)
    if method in ("gptq", "awq"):
        from .hf_int4 import int4_scheme

        return int4_scheme(qc, source)
    raise ModelLoadError(f"{source}: quantized HF checkpoints with quant_method {method!r} are not supported yet "
                         f"(supported: {SUPPORTED}); use the unquantized checkpoint or a GGUF file")


def _compressed_tensors(qc: dict, source: str) -> Fp8Scheme:
    fmt = qc.get("format")
    groups = list((qc.get("config_groups") or {}).values())
    if fmt == "pack-quantized" and groups:
        from .hf_int4 import compressed_tensors_int4_scheme

        return compressed_tensors_int4_scheme(groups, source)
    if fmt not in ("float-quantized", "naive-quantized") or not groups:
        raise ModelLoadError(f"{source}: compressed-tensors format {fmt!r} is not supported yet (float-quantized "
                             "W8A8 FP8 and pack-quantized W4A16 are)")
    schemes = []
    for g in groups:
        w, a = g.get("weights") or {}, g.get("input_activations")
        if (w.get("num_bits"), w.get("type")) != (8, "float") or not a or (a.get("num_bits"), a.get("type")) != (
                8, "float"):
            raise ModelLoadError(f"{source}: compressed-tensors group {g.get('targets')} is not W8A8 FP8 (weights "
                                 f"{w.get('num_bits')}-bit {w.get('type')}, activations "
                                 f"{a and a.get('num_bits')}-bit {a and a.get('type')}); only W8A8 FP8 is supported")
        if w.get("strategy") == "block" and list(w.get("block_structure") or []) != [128, 128]:
            raise ModelLoadError(f"{source}: block_structure {w.get('block_structure')} (128x128 is supported)")
        if w.get("strategy") not in ("tensor", "channel", "block"):
            raise ModelLoadError(f"{source}: weight strategy {w.get('strategy')!r} is not supported for FP8")
        strategy, dynamic = a.get("strategy"), a.get("dynamic")
        if strategy == "group" and a.get("group_size") == 128 and dynamic:
            schemes.append(Fp8Scheme("weight_scale", 128, description="FP8 W8A8, 1x128 activation groups"))
        elif strategy in ("token", "tensor") and dynamic:
            # dynamic per tensor runs per token: finer scales, never a worse rounding of any row
            schemes.append(Fp8Scheme("weight_scale", 0, description="FP8 W8A8, dynamic per-token activations"))
        elif strategy == "tensor" and not dynamic:
            schemes.append(Fp8Scheme("weight_scale", 0, static=True, description="FP8 W8A8, static activations"))
        else:
            raise ModelLoadError(f"{source}: activation strategy {strategy!r} (dynamic={dynamic}) is not supported")
    if len({(s.act_group, s.static) for s in schemes}) > 1:
        raise ModelLoadError(f"{source}: compressed-tensors groups quantize activations differently; not supported")
    return schemes[0]
