"""AMD Quark checkpoints (``quant_method: "quark"``, the safetensors export that transformers and vLLM read).

- OCP MXFP4 weights (``dtype: "fp4"``, ``qscheme: "per_group"``, ``group_size: 32``, ``scale_format: "e8m0"``): each
  quantized linear's ``weight`` is uint8 [N, K/2] (two e2m1 codes a byte, the even element in the low nibble, as
  ``torch.float4_e2m1fn_x2`` packs them) and ``weight_scale`` uint8 [N, K/32], an e8m0 exponent per 32 (``2**(s -
  127)``). They become NVFP4 weights, exactly: the codes as they are, each 32-block's power of two as two 16-blocks'
  e4m3 scale, relative to one per-tensor power of two (the global scale), so the NVFP4 kernels (dense and MoE) run
  them. e4m3 holds powers of two over 18 octaves (2**-9 .. 2**8); a block scale more than 17 octaves below the
  tensor's largest is out of reach, and its block is flushed to zero with a warning that says how many and how small.
  Activations quantized to MXFP4 in the checkpoint's config (W4A4) run unquantized (W4A16), as on any GPU without
  MX tensor cores.
- FP8 weights (``dtype: "fp8_e4m3"``, per tensor or per channel ``weight_scale``) with static per-tensor or dynamic
  activations: W8A8 FP8, as hf_quant.py reads them.

Layers in ``exclude`` are stored unquantized and stay plain tensors; per-layer configs must agree with the global one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.core.models.weights import Nvfp4Weight

from .errors import ModelLoadError

log = logging.getLogger("engine")

MX_BLOCK = 32
E4M3_TOP = 8  # 2**8: the largest power of two an e4m3 scale holds exactly below its max (448)
E4M3_OCTAVES = 17  # down to 2**-9, its smallest subnormal
_SUFFIXES = ("weight_scale", "input_scale", "output_scale")


def mxfp4_as_nvfp4(packed: torch.Tensor, scale_e8m0: torch.Tensor, name: str = "") -> Nvfp4Weight:
    """An MXFP4 matrix (uint8 codes [N, K/2], e8m0 exponents [N, K/32]) as the same values in NVFP4's layout."""
    n, half = packed.shape
    if scale_e8m0.dtype != torch.uint8 or tuple(scale_e8m0.shape) != (n, half * 2 // MX_BLOCK) or half * 2 % MX_BLOCK:
        raise ModelLoadError(f"{name}: MXFP4 needs uint8 e8m0 scales [{n}, {half * 2 // MX_BLOCK}] for codes "
                             f"[{n}, {half}] (K a multiple of 32), got {scale_e8m0.dtype} {list(scale_e8m0.shape)}")
    exp = scale_e8m0.to(torch.int32)
    if bool((exp == 255).any()):
        raise ModelLoadError(f"{name}: an e8m0 scale is 255 (NaN); the checkpoint is corrupt")
    # blocks whose codes are all +-0 carry no value: their scale does not matter
    live = (packed.reshape(n, -1, MX_BLOCK // 2) & 0x77).amax(-1) > 0
    top = int(exp[live].max()) if bool(live.any()) else 127
    shift = max(-126, min(127, E4M3_TOP + 127 - top))  # global scale 2**shift puts the largest block at 2**8
    rel = exp - 127 + shift  # each block's scale relative to the global one, as a power of two
    lost = live & (rel < E4M3_TOP - E4M3_OCTAVES)
    if bool(lost.any()):
        log.warning("engine: %s: %d of %d MXFP4 blocks have scales more than %d octaves below the matrix's largest "
                    "(down to 2**%d of it); NVFP4's e4m3 scales cannot hold them, so those blocks are zero",
                    name, int(lost.sum()), lost.numel(), E4M3_OCTAVES, int((exp[lost] - top).min()))
    block = torch.where(rel >= E4M3_TOP - E4M3_OCTAVES, torch.exp2(rel.float()), torch.zeros((), dtype=torch.float32))
    block_scale = block.to(torch.float8_e4m3fn).repeat_interleave(2, dim=1)  # exact: powers of two in range
    return Nvfp4Weight(packed, block_scale, torch.tensor([2.0 ** shift], dtype=torch.float32))


@dataclass
class QuarkMxfp4Scheme:
    description: str = "OCP MXFP4 (e2m1, e8m0 scales per 32), run as NVFP4"

    def keeps(self, name: str, t: torch.Tensor) -> bool:
        return name.rsplit(".", 1)[-1] in _SUFFIXES

    def pack(self, weights: dict[str, torch.Tensor], source: str) -> dict:
        out = {}
        for name, t in weights.items():
            if name.rsplit(".", 1)[-1] in _SUFFIXES:
                continue
            if t.dtype != torch.uint8:
                out[name] = t
                continue
            scale = weights.get(name.removesuffix("weight") + "weight_scale")
            if not name.endswith(".weight") or t.dim() != 2 or scale is None:
                raise ModelLoadError(f"{source}: {name} is uint8 {list(t.shape)} without a weight_scale beside it; "
                                     "the checkpoint does not follow Quark's MXFP4 export")
            out[name] = mxfp4_as_nvfp4(t, scale, f"{source}: {name}")
        return out


def _same(a: dict | None, b: dict | None, keys=("dtype", "qscheme", "group_size", "scale_format", "is_dynamic")):
    return all((a or {}).get(k) == (b or {}).get(k) for k in keys)


def quark_scheme(qc: dict, source: str):
    """The scheme for a Quark ``quantization_config``; ModelLoadError naming what is not supported."""
    glob = qc.get("global_quant_config") or {}
    weight, acts = glob.get("weight"), glob.get("input_tensors")
    for pattern, cfg in {**(qc.get("layer_quant_config") or {}), **(qc.get("layer_type_quant_config") or {})}.items():
        if not (_same(cfg.get("weight"), weight) and _same(cfg.get("input_tensors"), acts)):
            raise ModelLoadError(f"{source}: Quark layers {pattern!r} are quantized unlike the rest; mixed schemes are "
                                 "not supported")
    if isinstance(weight, list) or not isinstance(weight, dict):
        raise ModelLoadError(f"{source}: Quark weight config {weight!r} is not supported (MXFP4 and FP8 are)")
    if glob.get("output_tensors") or glob.get("bias"):
        raise ModelLoadError(f"{source}: Quark checkpoints with quantized outputs or biases are not supported")
    dtype = weight.get("dtype")
    if dtype == "fp4":
        if (weight.get("qscheme"), weight.get("group_size"), weight.get("scale_format")) != ("per_group", 32, "e8m0"):
            raise ModelLoadError(f"{source}: Quark fp4 weights {weight} are not OCP MXFP4 (per_group, group_size 32, "
                                 "scale_format e8m0)")
        return QuarkMxfp4Scheme()
    if dtype == "fp8_e4m3":
        from .hf_quant import Fp8Scheme

        if weight.get("qscheme") not in ("per_tensor", "per_channel"):
            raise ModelLoadError(f"{source}: Quark FP8 weights {weight.get('qscheme')!r} (per_tensor and per_channel "
                                 "are supported)")
        static = bool(acts) and not acts.get("is_dynamic", False)
        if acts and (acts.get("dtype") != "fp8_e4m3" or (static and acts.get("qscheme") != "per_tensor")):
            raise ModelLoadError(f"{source}: Quark FP8 activations {acts} are not supported (fp8_e4m3, static per "
                                 "tensor or dynamic)")
        return Fp8Scheme("weight_scale", 0, static=static, description="Quark FP8 W8A8, "
                         + ("static per-tensor activations" if static else "per-token activations"))
    raise ModelLoadError(f"{source}: Quark weight dtype {dtype!r} is not supported (fp4 as OCP MXFP4, fp8_e4m3)")
