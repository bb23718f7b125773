"""ModelOpt (NVIDIA Model Optimizer) checkpoints: ``quant_method: "modelopt"`` in config.json's
``quantization_config``, or ``hf_quant_config.json`` beside it (``{"quantization": {"quant_algo": ...}}``).

- ``quant_algo: "NVFP4"``: each quantized linear's ``weight`` is uint8 [N, K/2] (two e2m1 codes a byte, the first
  element in the low nibble), ``weight_scale`` float8_e4m3fn [N, K/16] (one scale per 16 elements), ``weight_scale_2``
  fp32 (the per-tensor scale: ``w = e2m1 * weight_scale * weight_scale_2``) and ``input_scale`` fp32 (the calibrated
  activation scale, for FP4 tensor cores). Kept as :class:`Nvfp4Weight`.
- ``quant_algo: "FP8"``: float8_e4m3fn weights with a per-tensor ``weight_scale`` and a static per-tensor
  ``input_scale`` (read as W8A8 FP8, hf_quant.py's Fp8Weight).

``exclude_modules`` (lm_head, say) are stored unquantized and stay plain tensors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from engine.core.models.weights import Nvfp4Weight

from .errors import ModelLoadError

_NVFP4_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")


def modelopt_config(model_dir: str) -> dict | None:
    """``hf_quant_config.json``'s quantization section as a quantization_config (quant_method "modelopt"), for a
    ModelOpt checkpoint whose config.json has none; None without that file."""
    path = os.path.join(model_dir, "hf_quant_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            section = json.load(f).get("quantization")
    except (OSError, ValueError, AttributeError) as e:
        raise ModelLoadError(f"{path} cannot be read as ModelOpt's quantization config ({e})") from e
    if not isinstance(section, dict):
        raise ModelLoadError(f"{path} has no 'quantization' object")
    return {"quant_method": "modelopt", **section}


@dataclass
class Nvfp4Scheme:
    description: str = "NVFP4 (e2m1, fp8 scales per 16, fp32 per tensor)"

    def keeps(self, name: str, t: torch.Tensor) -> bool:
        """FP8 block scales and fp32 tensor scales keep their dtype (the uint8 codes are not floats: never cast)."""
        return t.is_floating_point() and t.element_size() == 1 or name.rsplit(".", 1)[-1] in _NVFP4_SUFFIXES

    def pack(self, weights: dict[str, torch.Tensor], source: str) -> dict:
        out = {}
        for name, t in weights.items():
            if name.rsplit(".", 1)[-1] in _NVFP4_SUFFIXES:
                continue
            if t.dtype != torch.uint8:
                out[name] = t
                continue
            base = name.removesuffix("weight")
            scale, scale_2 = weights.get(base + "weight_scale"), weights.get(base + "weight_scale_2")
            if not name.endswith(".weight") or t.dim() != 2 or scale is None or scale_2 is None:
                raise ModelLoadError(f"{source}: {name} is uint8 {list(t.shape)} without weight_scale and "
                                     "weight_scale_2 beside it; the checkpoint does not follow ModelOpt's NVFP4 layout")
            n, half = t.shape
            if scale.dtype != torch.float8_e4m3fn or tuple(scale.shape) != (n, half * 2 // 16) or scale_2.numel() != 1:
                raise ModelLoadError(f"{source}: {base}weight_scale is {scale.dtype} {list(scale.shape)} and "
                                     f"weight_scale_2 has {scale_2.numel()} elements; NVFP4 needs float8_e4m3fn "
                                     f"[{n}, {half * 2 // 16}] and one fp32 scale")
            inp = weights.get(base + "input_scale")
            out[name] = Nvfp4Weight(t, scale, (1.0 / scale_2.float()).reshape(1),
                                    None if inp is None else (1.0 / inp.float()).reshape(1))
        return out


def modelopt_scheme(qc: dict, source: str):
    algo = str(qc.get("quant_algo", "")).upper()
    if algo == "NVFP4":
        if int(qc.get("group_size", 16)) != 16:
            raise ModelLoadError(f"{source}: NVFP4 with group_size {qc.get('group_size')} (16 is the format's)")
        return Nvfp4Scheme()
    if algo == "FP8":
        from .hf_quant import Fp8Scheme

        return Fp8Scheme("weight_scale", 0, static=True, description="ModelOpt FP8 per tensor, static activations")
    raise ModelLoadError(f"{source}: ModelOpt quant_algo {qc.get('quant_algo')!r} is not supported yet (NVFP4 and FP8 "
                         "are); use the unquantized checkpoint")
