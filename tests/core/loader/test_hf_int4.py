"""GPTQ (v1 and v2 zero formats, symmetric and not), AWQ and compressed-tensors 4-bit checkpoints, packed in the test as
the quantizers write them from a random transformers model: they load as Int4Weight; on the CPU platform (no
int4_linear kernel) the model holds them as GGUF 4-bit blocks (Q4_0 when symmetric, else Q4_1), on a platform with an
int4_linear kernel (the Triton one, under the interpreter here) as they are; either way the logits match
transformers' forward pass on the dequantized weights, (q - z) * s."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.core.loader import ModelLoadError
from engine.core.loader.checkpoint import load_checkpoint
from engine.core.models.weights import Int4Weight, QuantizedWeight
from engine.core.ops.gguf_quant import Q4_0, Q4_1
from engine.platforms.cpu.platform import CpuPlatform
from tests.core.loader.test_hf_fp8 import LINEARS, random_llama
from tests.core.models.test_tiny_random_vs_hf import VOCAB

pytest.importorskip("transformers")

AWQ_COLUMN_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble j of an AWQ word holds column AWQ_COLUMN_ORDER[j]


def pack_along_last(v: torch.Tensor, order=range(8)) -> torch.Tensor:
    """[..., C*8] values 0..15 -> int32 [..., C], nibble j holding element order[j] of each group of 8."""
    groups = v.to(torch.int64).reshape(*v.shape[:-1], -1, 8)
    word = torch.zeros(groups.shape[:-1], dtype=torch.int64)
    for j, col in enumerate(order):
        word |= groups[..., col] << (4 * j)
    return (word - (word >= 2**31) * 2**32).to(torch.int32)  # the bits as int32


def quantize(w: torch.Tensor, group: int, sym: bool):
    """(q [N, K], z [G, N], s [G, N] fp16) of w [N, K]: 4-bit, min/max per group (symmetric: z = 8)."""
    n, k = w.shape
    g = k if group == -1 else group
    qs, zs, ss = [], [], []
    for j in range(0, k, g):
        part = w[:, j:j + g]
        if sym:
            s = (part.abs().amax(dim=1) / 7.5).clamp(min=1e-6).half()
            z = torch.full((n,), 8)
        else:
            lo, hi = part.amin(dim=1), part.amax(dim=1)
            s = ((hi - lo) / 15).clamp(min=1e-6).half()
            z = torch.round(-lo / s.float()).clamp(0, 15).to(torch.int64)
        q = torch.round(part / s.float()[:, None] + z[:, None]).clamp(0, 15).to(torch.int64)
        qs.append(q)
        zs.append(z)
        ss.append(s)
    return torch.cat(qs, 1), torch.stack(zs), torch.stack(ss)


def dequantize(q, z, s, group):
    g = q.shape[1] if group == -1 else group
    cols = torch.arange(q.shape[1]) // g
    return (q - z.t()[:, cols]).float() * s.t().float()[:, cols]


# name: (method, group size, symmetric, checkpoint_format)
LAYOUTS = {"gptq_sym_g128": ("gptq", 128, True, "gptq"), "gptq_asym_g32": ("gptq", 32, False, "gptq"),
           "gptq_v2_asym_g64": ("gptq", 64, False, "gptq_v2"), "gptq_sym_channel": ("gptq", -1, True, "gptq"),
           "awq_g128": ("awq", 128, False, None), "awq_g32": ("awq", 32, False, None),
           "ct_w4a16_g128": ("compressed-tensors", 128, True, None), "ct_w4a16_channel": ("compressed-tensors", -1,
                                                                                         True, None)}


def write(tensors, base, method, q, z, s, fmt, g_idx_group):
    if method == "compressed-tensors":  # [N, K/8] along k; the signed value q - 8 stored + 8, i.e. q itself
        tensors[base + "weight_packed"] = pack_along_last(q)
        tensors[base + "weight_scale"] = s.t().contiguous().to(torch.bfloat16)
        tensors[base + "weight_shape"] = torch.tensor(list(q.shape))
        return
    if method == "gptq":
        n = q.shape[0]  # [K/8, N]: word [i, n] holds k = 8i..8i+7 of row n
        tensors[base + "qweight"] = pack_along_last(q.t().reshape(-1, 8, n).transpose(1, 2).reshape(-1, n * 8))
        tensors[base + "qzeros"] = pack_along_last(z - (1 if fmt == "gptq" else 0))
        tensors[base + "g_idx"] = (torch.arange(q.shape[1]) // g_idx_group).to(torch.int32)
    else:
        tensors[base + "qweight"] = pack_along_last(q.t().contiguous(), AWQ_COLUMN_ORDER)
        tensors[base + "qzeros"] = pack_along_last(z, AWQ_COLUMN_ORDER)
    tensors[base + "scales"] = s


@pytest.fixture(params=sorted(LAYOUTS))
def checkpoint(request, tmp_path):
    return request.param, write_checkpoint(request.param, tmp_path), tmp_path


def write_checkpoint(layout: str, tmp_path):
    """The layout's checkpoint in tmp_path; returns transformers' model on the dequantized weights."""
    hf, tensors = random_llama(tmp_path)
    names = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]
    for name, w in quantize_into(tensors, names, layout).items():
        hf.get_submodule(name.removesuffix(".weight")).weight.data = w
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    add_quantization_config(tmp_path, layout)
    return hf


def quantize_into(tensors: dict, names: list[str], layout: str) -> dict:
    """Replace each named weight in ``tensors`` by the layout's packed tensors; returns {name: dequantized weight}."""
    method, group, sym, fmt = LAYOUTS[layout]
    dequantized = {}
    for name in names:
        w = tensors.pop(name).float()
        q, z, s = quantize(w, group, sym)
        if method == "compressed-tensors":  # its scales are written in bf16
            s = s.to(torch.bfloat16).to(torch.float16)
        write(tensors, name.removesuffix("weight"), method, q, z, s, fmt, w.shape[1] if group == -1 else group)
        dequantized[name] = dequantize(q, z, s, group)
    return dequantized


def add_quantization_config(path, layout: str) -> None:
    """The layout's ``quantization_config``, as its quantizer writes it, added to path/config.json."""
    method, group, sym, fmt = LAYOUTS[layout]
    qc = {"gptq": {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym, "desc_act": False,
                   "checkpoint_format": fmt},
          "awq": {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"},
          "compressed-tensors": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                 "ignore": ["lm_head"], "config_groups": {"group_0": {
                                     "targets": ["Linear"], "input_activations": None, "weights": {
                                         "num_bits": 4, "type": "int", "symmetric": True,
                                         "strategy": "channel" if group == -1 else "group",
                                         "group_size": None if group == -1 else group}}}}}[method]
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))


class CpuWithTritonInt4(CpuPlatform):
    """The cpu platform plus the Triton int4_linear and int8_linear kernels on CPU tensors (the Triton interpreter): a
    platform that keeps 4- and 8-bit weights as they are, as the GPU ones do."""

    name = "cpu_triton_int4"

    def register_kernels(self, registry) -> None:
        super().register_kernels(registry)
        from engine.platforms.triton_kernels import int4_linear, int8_linear

        int4_linear.register(registry, "cpu")
        int8_linear.register(registry, "cpu")


def _logits_against_transformers(llm, hf, name, tol):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    ids = torch.randint(0, VOCAB, (29,), generator=gen).tolist()
    ours = llm.prompt_logits(ids).cpu()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


def test_int4_checkpoints_run_as_gguf_blocks_and_match_transformers(checkpoint):
    name, hf, path = checkpoint
    loaded = load_checkpoint(str(path), dtype=torch.float32).weights["model.layers.0.self_attn.o_proj.weight"]
    assert isinstance(loaded, Int4Weight) and loaded.shape == (256, 256), name
    llm = LLM(str(path), dtype="float32", num_kv_blocks=32, block_size=16)
    layer = llm.model.layers[0]
    w = layer.attn.o_proj.w
    sym = LAYOUTS[name][2]
    assert isinstance(w, QuantizedWeight) and w.qtype == (Q4_0 if sym else Q4_1) and w.shape == (256, 256), name
    # symmetric: the same numbers (Q4_0 is (q - 8) * s exactly); else Q4_1's offset m = -z * s is rounded to fp16
    _logits_against_transformers(llm, hf, name, 1e-4 if sym else 2e-3)


@pytest.mark.parametrize("layout", ["gptq_asym_g32", "awq_g128", "ct_w4a16_channel", "gptq_sym_g128"])
def test_int4_checkpoints_stay_4bit_where_the_platform_has_int4_linear(layout, tmp_path):
    pytest.importorskip("triton")
    hf = write_checkpoint(layout, tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16, platform=CpuWithTritonInt4())
    from engine.platforms.triton_kernels.int4_linear import int4_linear_triton

    layer = llm.model.layers[0]
    assert isinstance(layer.attn.o_proj.w, Int4Weight)
    # (q - z) * s exactly as transformers has it, asymmetric too (no fp16 offset as in Q4_1)
    _logits_against_transformers(llm, hf, layout, 1e-4)
    chosen = layer.attn.o_proj.site.chosen()
    assert chosen and all(f is int4_linear_triton for f in chosen.values()), chosen


def test_act_order_and_other_layouts_are_refused(tmp_path):
    path = tmp_path
    write_checkpoint("gptq_sym_g128", path)
    tensors = load_file(path / "model.safetensors")
    key = next(n for n in tensors if n.endswith("o_proj.g_idx"))
    tensors[key] = tensors[key].flip(0).contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="act-order"):
        LLM(str(path), num_kv_blocks=8)
    config = json.loads((path / "config.json").read_text())
    for qc, message in (({"quant_method": "gptq", "bits": 4, "group_size": 48}, "multiple of 32"),
                        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "gemv"),
                        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
                         "marlin")):
        (path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
        with pytest.raises(ModelLoadError, match=message):
            LLM(str(path), num_kv_blocks=8)
