"""GPTQ, AWQ and compressed-tensors W4A16 4-bit checkpoints, unpacked at load into one layout: :class:`Int4Weight`
(codes two a byte along k, the group scales as stored, zero points where they are not all 8); GPTQ and
compressed-tensors 8-bit ones (W8A16) into :class:`Int8Weight` (a code a byte, zero points where they are not all 128).

A 4-bit group-quantized weight is ``W[n, k] = (q[n, k] - z[g, n]) * s[g, n]`` with ``g = k // group_size``. Platforms
with an ``int4_linear`` kernel (the GPUs' Triton one) run it as it is; elsewhere the model turns it into GGUF Q4_0 /
Q4_1 blocks at load (``weights.int4_as_gguf``), which the native CPU kernels run. MoE experts always become GGUF blocks
(``fused_moe_gguf``).

Layouts, as the quantizers write them:
- GPTQ (AutoGPTQ / GPTQModel, ``checkpoint_format`` "gptq"): ``qweight`` int32 [K/8, N] (8 nibbles along k, low
  bits first), ``qzeros`` int32 [G, N/8] (along n) holding zero - 1 ("gptq_v2": the zero itself), ``scales`` fp16
  [G, N], ``g_idx`` int32 [K] (must be k // group_size: act-order checkpoints with a permuted g_idx are refused).
- AWQ (AutoAWQ "gemm"): ``qweight`` int32 [K, N/8] and ``qzeros`` int32 [G, N/8], 8 nibbles along n in the order
  0, 2, 4, 6, 1, 3, 5, 7; ``scales`` fp16 [G, N].
- compressed-tensors ``pack-quantized`` (llm-compressor's W4A16): ``weight_packed`` int32 [N, K/8] (8 nibbles along
  k, each signed value stored + 8), ``weight_scale`` [N, G], symmetric. Read as the compressed-tensors package
  documents its packing; not yet checked against a published checkpoint here.
- 8 bits: the same tensors with 4 bytes a word instead of 8 nibbles (GPTQ ``qweight`` [K/4, N], ``qzeros``
  [G, N/4]; compressed-tensors ``weight_packed`` [N, K/4], values stored + 128), as Qwen's GPTQ-Int8 releases are.
"""

from __future__ import annotations

import torch

from engine.core.models.weights import Int4Weight, Int8Weight
from engine.core.ops.int4 import ALIGN, pack_codes

from .errors import ModelLoadError

AWQ_NIBBLE_OF_COLUMN = [0, 4, 1, 5, 2, 6, 3, 7]  # AWQ packs columns 0,2,4,6,1,3,5,7 into nibbles 0..7


def nibbles(packed: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int32 [..., C] -> [..., C * 32 / bits] values 0 .. 2**bits - 1, field j of each word (low bits first) at
    position (32 / bits) c + j."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return ((packed.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*packed.shape[:-1], -1)


class Int4Scheme:
    """A 4- or 8-bit integer weight-only scheme (``bits``): how its tensors become Int4Weight / Int8Weight."""

    def __init__(self, method: str, group_size: int, zero_offset: int, description: str, bits: int = 4):
        self.method, self.group_size, self.zero_offset = method, group_size, zero_offset
        self.description, self.bits = description, bits

    def keeps(self, name: str, t: torch.Tensor) -> bool:
        return name.endswith((".scales", ".weight_scale"))  # group scales stay as written (fp16 or bf16)

    def pack(self, weights: dict[str, torch.Tensor], source: str) -> dict:
        if self.method == "compressed-tensors":
            return self._pack_ct(weights, source)
        out = dict(weights)
        for base in sorted(n.removesuffix("qweight") for n in weights if n.endswith(".qweight")):
            parts = {p: out.pop(base + p, None) for p in ("qweight", "qzeros", "scales", "g_idx")}
            if parts["scales"] is None or parts["qzeros"] is None:
                raise ModelLoadError(f"{source}: {base}qweight has no scales or qzeros beside it; the checkpoint "
                                     f"does not follow its {self.method} quantization_config")
            out[base + "weight"] = self._repack(base, source, **parts)
        return out

    def _pack_ct(self, weights: dict[str, torch.Tensor], source: str) -> dict:
        """compressed-tensors pack-quantized: ``weight_packed`` int32 [N, K/8] (8 nibbles along k, low bits first,
        each value stored + 8; 8 bits: [N, K/4], + 128), ``weight_scale`` [N, G]: symmetric, W = (q - 8) * s."""
        out = dict(weights)
        for base in sorted(n.removesuffix("weight_packed") for n in weights if n.endswith(".weight_packed")):
            packed, scale = out.pop(base + "weight_packed"), out.pop(base + "weight_scale", None)
            out.pop(base + "weight_shape", None)
            if scale is None:
                raise ModelLoadError(f"{source}: {base}weight_packed has no weight_scale beside it")
            q = nibbles(packed, self.bits)
            mid = 1 << (self.bits - 1)
            out[base + "weight"] = self._repack(base, source, q=q, z=torch.full((scale.shape[1], q.shape[0]), mid),
                                                scales=scale.t(), g_idx=None)
        return out

    def _repack(self, base, source, qweight=None, qzeros=None, scales=None, g_idx=None, q=None, z=None):
        if q is not None:  # already unpacked
            pass
        elif self.method == "gptq":
            q = nibbles(qweight.t(), self.bits).contiguous()  # [N, K]
            z = nibbles(qzeros, self.bits)  # [G, N]
        else:
            perm = torch.tensor(AWQ_NIBBLE_OF_COLUMN)
            q = nibbles(qweight).reshape(qweight.shape[0], -1, 8)[..., perm].reshape(qweight.shape[0], -1).t()
            z = nibbles(qzeros).reshape(qzeros.shape[0], -1, 8)[..., perm].reshape(qzeros.shape[0], -1)
        n, k = q.shape
        group = k if self.group_size == -1 else self.group_size
        if tuple(scales.shape) != (-(-k // group), n) or tuple(z.shape) != tuple(scales.shape):
            raise ModelLoadError(f"{source}: {base}scales {list(scales.shape)} / qzeros do not fit a [{n}, {k}] "
                                 f"weight in groups of {group}")
        if k % ALIGN or group % ALIGN:
            raise ModelLoadError(f"{source}: {base}weight has K={k} and groups of {group}; both must be multiples of "
                                 f"{ALIGN} (every published {self.bits}-bit layout is)")
        if g_idx is not None and not torch.equal(g_idx.to(torch.int64), torch.arange(k) // group):
            raise ModelLoadError(f"{source}: {base}g_idx reorders the input columns (an act-order / desc_act GPTQ "
                                 "checkpoint), which is not supported yet; use a checkpoint quantized without "
                                 "desc_act")
        z = (z + self.zero_offset).t()  # [N, G]
        top, mid = (1 << self.bits) - 1, 1 << (self.bits - 1)
        if bool(((z < 0) | (z > top)).any()):
            raise ModelLoadError(f"{source}: {base}qzeros hold zero points outside 0..{top} (with the "
                                 f"{self.method} offset {self.zero_offset}); the checkpoint does not follow its "
                                 "quantization_config")
        zero = None if bool((z == mid).all()) else z.to(torch.uint8).contiguous()
        if self.bits == 8:
            return Int8Weight(q.to(torch.uint8).contiguous(), scales.t().contiguous(), zero, group)
        return Int4Weight(pack_codes(q), scales.t().contiguous(), zero, group)


def int4_scheme(qc: dict, source: str) -> Int4Scheme:
    method = qc.get("quant_method")
    bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
    if bits not in (4, 8) or (bits == 8 and method != "gptq"):
        raise ModelLoadError(f"{source}: {method} with {bits}-bit weights is not supported (4-bit is; GPTQ 8-bit too)")
    if not isinstance(group, int) or (group != -1 and (group <= 0 or group % ALIGN)):
        raise ModelLoadError(f"{source}: {method} group_size {group!r}: a multiple of {ALIGN} or -1 is supported")
    if method == "gptq":
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ModelLoadError(f"{source}: GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2 are)")
        return Int4Scheme("gptq", group, 1 if fmt == "gptq" else 0, f"GPTQ {bits}-bit, groups of {group}", bits)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ModelLoadError(f"{source}: AWQ version {version!r} is not supported (gemm is)")
    if qc.get("zero_point") is False:
        raise ModelLoadError(f"{source}: AWQ without zero points is not supported")
    return Int4Scheme("awq", group, 0, f"AWQ 4-bit, groups of {group}")


def compressed_tensors_int4_scheme(groups: list[dict], source: str) -> Int4Scheme:
    """compressed-tensors ``pack-quantized`` W4A16 / W8A16: 4- or 8-bit symmetric integer weights per group or per
    channel, no activation quantization."""
    sizes, bits = set(), set()
    for g in groups:
        w, a = g.get("weights") or {}, g.get("input_activations")
        if w.get("num_bits") not in (4, 8) or w.get("type") != "int" or a:
            raise ModelLoadError(f"{source}: compressed-tensors pack-quantized group {g.get('targets')} is not W4A16 "
                                 f"or W8A16 ({w.get('num_bits')}-bit {w.get('type')} weights, activations {a}); "
                                 "only weight-only integer groups are read")
        bits.add(w["num_bits"])
        if not w.get("symmetric", True):
            raise ModelLoadError(f"{source}: asymmetric compressed-tensors INT4 (zero points) is not supported yet")
        if w.get("strategy") == "channel":
            sizes.add(-1)
        elif w.get("strategy") == "group" and isinstance(w.get("group_size"), int) and w["group_size"] % ALIGN == 0:
            sizes.add(w["group_size"])
        else:
            raise ModelLoadError(f"{source}: compressed-tensors INT4 strategy {w.get('strategy')!r} group_size "
                                 f"{w.get('group_size')!r}: groups of a multiple of {ALIGN}, or channel, are read")
    if len(sizes) != 1 or len(bits) != 1:
        raise ModelLoadError(f"{source}: compressed-tensors groups use different group sizes {sorted(sizes)} or "
                             f"widths {sorted(bits)}")
    size, width = sizes.pop(), bits.pop()
    return Int4Scheme("compressed-tensors", size, 0, f"compressed-tensors W{width}A16, groups of {size}", width)
