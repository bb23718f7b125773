"""ModelOpt checkpoints written in the test from a random transformers Llama, in ModelOpt's export layout: NVFP4
(uint8 codes, float8_e4m3fn scales per 16, fp32 weight_scale_2 and input_scale), its quantization config in
config.json or only in hf_quant_config.json, q/k/v and gate/up calibrated together (stacked into one GEMM) or not;
and ModelOpt FP8. The quantizer here is the test's own (nearest e2m1 by table); the oracle is transformers on the
dequantized weights. On a platform without FP4 tensor cores the linears run W4A16 (activations unquantized); where a
platform has a W4A4 kernel, the checkpoint's input scale quantizes the activations (tested with a stand-in kernel)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from engine import LLM
from engine.core.models.layers import Linear
from engine.core.models.weights import Fp8Weight, Nvfp4Weight
from engine.core.ops import KernelRegistry
from engine.core.ops import registry as ops_registry
from engine.core.ops.nvfp4 import _nvfp4_linear_ref, _nvfp4_linear_w4a4_ref, nvfp4_linear_w4a4
from tests.core.loader.test_hf_fp8 import dequantize as fp8_dequantize
from tests.core.loader.test_hf_fp8 import fake_quant_input, random_llama
from tests.core.loader.test_hf_fp8 import quantize as fp8_quantize

transformers = pytest.importorskip("transformers")

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def nvfp4_quantize(w: torch.Tensor, amax: torch.Tensor):
    """(uint8 codes [N, K/2], e4m3 scales [N, K/16], weight_scale_2) for ``w`` calibrated to ``amax``."""
    scale_2 = (amax / (6 * 448)).float()
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = (blocks.abs().amax(-1) / 6 / scale_2).clamp(max=448).to(torch.float8_e4m3fn)
    denom = (scale.float() * scale_2)[..., None]
    v = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1), 0).reshape(w.shape)
    codes = (v.abs()[..., None] - E2M1).abs().argmin(-1).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, scale_2.reshape(())


def nvfp4_dequantize(packed, scale, scale_2) -> torch.Tensor:
    codes = torch.stack((packed & 0xF, packed >> 4), -1).flatten(-2).long()
    values = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    return values * scale.float().repeat_interleave(16, 1) * scale_2


def write(tmp_path, algo: str, shared: bool, config_in: str):
    hf, tensors = random_llama(tmp_path)
    amax = {n: tensors[n].float().abs().max() for n in tensors if n.endswith(".weight")}
    if shared:  # q/k/v and gate/up of a layer calibrated together, as ModelOpt exports fused layers
        for name in list(amax):
            for group in GROUPS:
                if name.split(".")[-2] in group:
                    names = [name.replace(name.split(".")[-2], g) for g in group]
                    amax[name] = max(tensors[n].float().abs().max() for n in names)
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        base, w = name.removesuffix("weight"), tensors[name].float()
        if algo == "NVFP4":
            packed, scale, scale_2 = nvfp4_quantize(w, amax[name])
            tensors[name], tensors[base + "weight_scale"], tensors[base + "weight_scale_2"] = packed, scale, scale_2
            deq = nvfp4_dequantize(packed, scale, scale_2)
        else:
            q, s = fp8_quantize(w, "tensor")
            tensors[name], tensors[base + "weight_scale"] = q, s.reshape(())
            deq = fp8_dequantize(q, s)
            module = hf.get_submodule(name.removesuffix(".weight"))
            module.register_forward_pre_hook(lambda m, args: (fake_quant_input(args[0], 0.01),))
        tensors[base + "input_scale"] = torch.tensor(0.01)
        hf.get_submodule(name.removesuffix(".weight")).weight.data = deq
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    quant = {"quant_algo": algo, "group_size": 16, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    if config_in == "config.json":
        config = json.loads((tmp_path / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "modelopt", **quant}
        (tmp_path / "config.json").write_text(json.dumps(config))
    else:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": quant}))
    return hf


@pytest.mark.parametrize("algo,shared,config_in", [("NVFP4", True, "config.json"),
                                                   ("NVFP4", False, "hf_quant_config.json"),
                                                   ("FP8", False, "hf_quant_config.json")])
def test_modelopt_checkpoints_load_quantized_and_match_transformers(tmp_path, algo, shared, config_in, caplog):
    hf = write(tmp_path, algo, shared, config_in)
    with caplog.at_level("INFO", logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    assert "modelopt checkpoint; 14 matrices kept quantized" in caplog.text, caplog.text
    layer = llm.model.layers[0]
    kind = Nvfp4Weight if algo == "NVFP4" else Fp8Weight
    assert isinstance(layer.mlp.down.w, kind) and not isinstance(llm.model.lm_head, kind)
    if algo == "NVFP4":  # one GEMM for q/k/v and one for gate/up exactly where their scales agree
        assert (layer.attn.qkv is not None) == shared and (len(layer.mlp.gate_up) == 1) == shared
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    ids = torch.randint(0, 160, (23,), generator=gen).tolist()
    ours = llm.prompt_logits(ids).cpu()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    if algo == "NVFP4":  # W4A16 here: the dequantized weights are exact in fp32
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    else:  # FP8 rounding of activations, as in test_hf_fp8
        err, spread = (ours - theirs).abs(), theirs.std()
        assert err.mean() < 0.012 * spread and err.max() < 0.12 * spread


def test_w4a4_runs_where_the_platform_has_a_kernel_for_it(tmp_path):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    w = torch.randn(48, 64, generator=gen)
    packed, scale, scale_2 = nvfp4_quantize(w, w.abs().max())
    weight = Nvfp4Weight(packed, scale, (1 / scale_2).reshape(1), torch.tensor([1 / 0.01]))
    x = torch.randn(5, 64, generator=gen)
    calls = []

    def stand_in(*args):  # a platform's FP4 kernel, here the op's own arithmetic
        calls.append(1)
        return _nvfp4_linear_w4a4_ref(*args)

    before = ops_registry._ACTIVE
    try:
        plain = KernelRegistry("cpu")
        ops_registry.set_active_registry(plain)
        w4a16 = Linear(weight)((1,), x)
        torch.testing.assert_close(w4a16, _nvfp4_linear_ref(x, packed, scale, weight.global_scale, None))
        assert not calls
        fp4 = KernelRegistry("cpu")
        fp4.register(nvfp4_linear_w4a4, stand_in, name="stand_in_fp4", supports=lambda *a: True)
        ops_registry.set_active_registry(fp4)
        w4a4 = Linear(weight)((1,), x)
    finally:
        ops_registry.set_active_registry(before)
    assert calls and not torch.allclose(w4a4, w4a16)  # the activations were quantized with the input scale
    torch.testing.assert_close(w4a4, _nvfp4_linear_w4a4_ref(x, weight.input_global_scale, packed, scale,
                                                            weight.global_scale, None))


def test_nvfp4_moe_experts_stay_nvfp4_and_match_transformers(tmp_path, caplog):
    """NVFP4 experts load kept packed (fused_moe_nvfp4, W4A16 here), gate and up calibrated apart (their own
    weight_scale_2), as do the attention projections, and the logits are transformers' on the dequantized weights."""
    from tests.core.loader.test_hf_fp8_moe import load_dequantized, save_random_moe

    hf, tensors = save_random_moe(tmp_path, "qwen3_moe", vocab=160)
    deq = {}
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        w = tensors[name].float()
        packed, scale, scale_2 = nvfp4_quantize(w, w.abs().max())
        base = name.removesuffix("weight")
        tensors[name], tensors[base + "weight_scale"], tensors[base + "weight_scale_2"] = packed, scale, scale_2
        tensors[base + "input_scale"] = torch.tensor(0.01)
        deq[name] = nvfp4_dequantize(packed, scale, scale_2)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4",
                                                                                "group_size": 16}}))
    load_dequantized(hf, deq)  # W4A16 on this platform: activations unrounded
    with caplog.at_level("INFO", logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    assert "expanded" not in caplog.text, caplog.text
    assert "32 matrices kept quantized" in caplog.text  # q, k, v, o and 4 experts' gate, up, down in two layers
    experts = llm.model.layers[0].mlp.experts
    assert experts.nvfp4 and experts.w13.dtype == torch.uint8 and tuple(experts.w13.shape) == (4, 512, 128)
    assert isinstance(llm.model.layers[0].attn.o_proj.w, Nvfp4Weight)
    ids = torch.randint(0, 160, (19,), generator=torch.Generator().manual_seed(int.from_bytes(os.urandom(4),
                                                                                            "little"))).tolist()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(llm.prompt_logits(ids).cpu(), theirs, atol=1e-4, rtol=1e-4)
