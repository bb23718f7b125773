"""8-bit weight-only checkpoints (GPTQ 8-bit as Qwen's GPTQ-Int8 releases are, compressed-tensors W8A16) written in the
test from a random Llama: they load as Int8Weight, run as GGUF Q8_0 blocks on the cpu platform (symmetric; those with
zero points are expanded, with a warning) and as int8_linear where the platform has that kernel, and match
transformers on the dequantized weights."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import save_file

from engine import LLM
from engine.core.loader import ModelLoadError
from engine.core.loader.checkpoint import load_checkpoint
from engine.core.models.weights import Int8Weight, QuantizedWeight
from engine.core.ops.gguf_quant import Q8_0
from tests.core.loader.test_hf_fp8 import LINEARS, random_llama
from tests.core.loader.test_hf_int4 import CpuWithTritonInt4, _logits_against_transformers

pytest.importorskip("transformers")

# name: (method, group size, symmetric, checkpoint_format)
LAYOUTS = {"gptq_sym_g128": ("gptq", 128, True, "gptq"), "gptq_asym_g64": ("gptq", 64, False, "gptq"),
           "gptq_v2_sym_channel": ("gptq", -1, True, "gptq_v2"), "ct_w8a16_g128": ("compressed-tensors", 128, True,
                                                                                    None)}


def pack_bytes(v: torch.Tensor) -> torch.Tensor:
    """[..., C*4] values 0..255 -> int32 [..., C], byte j holding element 4c + j (low bits first)."""
    groups = v.to(torch.int64).reshape(*v.shape[:-1], -1, 4)
    word = sum(groups[..., j] << (8 * j) for j in range(4))
    return (word - (word >= 2**31) * 2**32).to(torch.int32)


def quantize8(w: torch.Tensor, group: int, sym: bool):
    """(q [N, K], z [G, N], s [G, N] fp16) of w [N, K]: 8-bit, min/max per group (symmetric: z = 128)."""
    n, k = w.shape
    g = k if group == -1 else group
    qs, zs, ss = [], [], []
    for j in range(0, k, g):
        part = w[:, j:j + g]
        if sym:
            s = (part.abs().amax(dim=1) / 127.5).clamp(min=1e-6).half()
            z = torch.full((n,), 128)
        else:
            lo, hi = part.amin(dim=1), part.amax(dim=1)
            s = ((hi - lo) / 255).clamp(min=1e-6).half()
            z = torch.round(-lo / s.float()).clamp(0, 255).to(torch.int64)
        qs.append(torch.round(part / s.float()[:, None] + z[:, None]).clamp(0, 255).to(torch.int64))
        zs.append(z)
        ss.append(s)
    return torch.cat(qs, 1), torch.stack(zs), torch.stack(ss)


def quantize_into8(tensors: dict, names: list[str], layout: str) -> dict:
    """Replace each named weight in ``tensors`` by the layout's 8-bit tensors; returns {name: dequantized weight}."""
    method, group, sym, fmt = LAYOUTS[layout]
    dequantized = {}
    for name in names:
        w = tensors.pop(name).float()
        q, z, s = quantize8(w, group, sym)
        base = name.removesuffix("weight")
        if method == "compressed-tensors":
            s = s.to(torch.bfloat16)
            tensors[base + "weight_packed"] = pack_bytes(q)  # [N, K/4]; the signed value q - 128 stored + 128
            tensors[base + "weight_scale"] = s.t().contiguous()
            tensors[base + "weight_shape"] = torch.tensor(list(q.shape))
        else:
            n = q.shape[0]  # qweight [K/4, N]: word [i, n] holds k = 4i..4i+3 of row n
            tensors[base + "qweight"] = pack_bytes(q.t().reshape(-1, 4, n).transpose(1, 2).reshape(-1, n * 4))
            tensors[base + "qzeros"] = pack_bytes(z - (1 if fmt == "gptq" else 0))
            tensors[base + "g_idx"] = (torch.arange(q.shape[1]) // (q.shape[1] if group == -1 else group)).to(
                torch.int32)
            tensors[base + "scales"] = s
        cols = torch.arange(q.shape[1]) // (q.shape[1] if group == -1 else group)
        dequantized[name] = (q - z.t()[:, cols]).float() * s.t().float()[:, cols]
    return dequantized


def add_quantization_config8(path, layout: str) -> None:
    method, group, sym, fmt = LAYOUTS[layout]
    qc = {"quant_method": "gptq", "bits": 8, "group_size": group, "sym": sym, "desc_act": False,
          "checkpoint_format": fmt} if method == "gptq" else {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": 8, "type": "int", "symmetric": True, "strategy": "group", "group_size": group}}}}
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))


def write_checkpoint(layout: str, path):
    """The layout's checkpoint in ``path``; returns transformers' model on the dequantized weights."""
    hf, tensors = random_llama(path)
    names = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]
    for name, w in quantize_into8(tensors, names, layout).items():
        hf.get_submodule(name.removesuffix(".weight")).weight.data = w
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    add_quantization_config8(path, layout)
    return hf


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_int8_checkpoints_on_the_cpu_match_transformers(layout, tmp_path, caplog):
    hf = write_checkpoint(layout, tmp_path)
    loaded = load_checkpoint(str(tmp_path), dtype=torch.float32).weights["model.layers.0.self_attn.o_proj.weight"]
    assert isinstance(loaded, Int8Weight) and loaded.shape == (256, 256), layout
    assert (loaded.zero is None) == LAYOUTS[layout][2]
    with caplog.at_level(logging.WARNING, logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    w = llm.model.layers[0].attn.o_proj.w
    if LAYOUTS[layout][2]:  # symmetric: GGUF Q8_0 blocks, the same numbers
        assert isinstance(w, QuantizedWeight) and w.qtype == Q8_0, layout
    else:
        assert isinstance(w, torch.Tensor) and "expanded to float32" in caplog.text, layout
    _logits_against_transformers(llm, hf, layout, 1e-4)


@pytest.mark.parametrize("layout", ["gptq_asym_g64", "ct_w8a16_g128"])
def test_int8_checkpoints_stay_8bit_where_the_platform_has_int8_linear(layout, tmp_path):
    pytest.importorskip("triton")
    hf = write_checkpoint(layout, tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16, platform=CpuWithTritonInt4())
    from engine.platforms.triton_kernels.int8_linear import int8_linear_triton

    layer = llm.model.layers[0]
    assert isinstance(layer.attn.o_proj.w, Int8Weight) and isinstance(layer.mlp.down.w, Int8Weight)
    _logits_against_transformers(llm, hf, layout, 1e-4)
    chosen = layer.attn.o_proj.site.chosen()
    assert chosen and all(f is int8_linear_triton for f in chosen.values()), chosen


def test_other_widths_are_refused(tmp_path):
    write_checkpoint("gptq_sym_g128", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for qc, message in (({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3-bit"),
                        ({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"}, "8-bit")):
        (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
        with pytest.raises(ModelLoadError, match=message):
            LLM(str(tmp_path), num_kv_blocks=8)


@pytest.mark.parametrize("layout", ["gptq_sym_g128", "gptq_asym_g64"])
def test_int8_moe_experts_as_q8_0_blocks_or_expanded(layout, tmp_path, caplog):
    """Qwen3-MoE with every projection 8-bit: symmetric experts run fused_moe_gguf on Q8_0 blocks, ones with zero
    points are expanded (one warning naming why); the logits match transformers on the dequantized weights."""
    from tests.core.loader.test_hf_fp8_moe import assert_routed_logits_close, load_dequantized, save_random_moe

    hf, tensors = save_random_moe(tmp_path, "qwen3_moe")
    dequantized = quantize_into8(tensors, [n for n in tensors if n.endswith("_proj.weight")], layout)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    add_quantization_config8(tmp_path, layout)
    load_dequantized(hf, dequantized)
    with caplog.at_level(logging.INFO, logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    experts = llm.model.layers[1].mlp.experts
    if LAYOUTS[layout][2]:
        assert experts.gguf and "expanded" not in caplog.text, caplog.text
    else:
        assert not experts.gguf and "8-bit experts with zero points" in caplog.text, caplog.text
    assert_routed_logits_close(llm, hf, layout)
