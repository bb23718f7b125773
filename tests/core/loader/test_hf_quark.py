"""AMD Quark OCP MXFP4 checkpoints (uint8 e2m1 codes, e8m0 exponents per 32), written in the test from random
transformers models with the test's own MXFP4 quantizer: dense (Llama) and MoE (Qwen3-MoE) load as NVFP4 weights
holding the same values, and the logits are transformers' on the dequantized weights. The conversion is exact where
a matrix's block scales span at most 17 octaves, and flushes (with a warning) the blocks below that."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from engine import LLM
from engine.core.loader.hf_quark import mxfp4_as_nvfp4
from engine.core.models.weights import Nvfp4Weight, dense_weight
from tests.core.loader.test_hf_fp8 import LINEARS, random_llama
from tests.core.loader.test_hf_fp8_moe import load_dequantized, save_random_moe
from tests.core.models.test_tiny_random_vs_hf import VOCAB

transformers = pytest.importorskip("transformers")

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MXFP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0", "is_dynamic": False,
         "ch_axis": -1, "round_method": "half_even"}
QUARK = {"quant_method": "quark", "exclude": ["lm_head"], "layer_quant_config": {},
         "export": {"pack_method": "reorder"},
         "global_quant_config": {"weight": MXFP4, "input_tensors": {**MXFP4, "is_dynamic": True},
                                 "output_tensors": None, "bias": None}}


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K/2] low nibble first, e8m0 uint8 [N, K/32]): OCP's shared exponent floor(log2(amax)) - 2,
    values clamped to 6 and rounded to the nearest e2m1 (the test's own quantizer)."""
    blocks = w.float().reshape(w.shape[0], -1, 32)
    amax = blocks.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0 ** -126))) - 2, torch.full_like(amax, -127))
    v = (blocks / torch.exp2(exp)[..., None]).clamp(-6, 6).reshape(w.shape)
    codes = (v.abs()[..., None] - E2M1).abs().argmin(-1).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), (exp + 127).to(torch.uint8)


def mxfp4_dequantize(packed: torch.Tensor, e8m0: torch.Tensor) -> torch.Tensor:
    codes = torch.stack((packed & 15, packed >> 4), -1).flatten(-2).long()
    values = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    return values * torch.exp2(e8m0.float() - 127).repeat_interleave(32, 1)


def _quantize_all(tensors: dict, names) -> dict:
    dequantized = {}
    for name in names:
        packed, e8m0 = mxfp4_quantize(tensors[name])
        tensors[name], tensors[name.removesuffix("weight") + "weight_scale"] = packed, e8m0
        dequantized[name] = mxfp4_dequantize(packed, e8m0)
    return dequantized


def _write_config(path) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": QUARK}))


def _compare(llm, hf, vocab: int) -> None:
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    ids = torch.randint(0, vocab, (23,), generator=gen).tolist()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(llm.prompt_logits(ids).cpu(), theirs, atol=1e-4, rtol=1e-4)


def test_mxfp4_llama_loads_as_nvfp4_and_matches_transformers(tmp_path, caplog):
    hf, tensors = random_llama(tmp_path)
    names = [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]
    for name, w in _quantize_all(tensors, names).items():
        hf.get_submodule(name.removesuffix(".weight")).weight.data = w
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _write_config(tmp_path)
    with caplog.at_level("INFO", logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    assert "quark checkpoint; 14 matrices kept quantized (OCP MXFP4" in caplog.text, caplog.text
    assert "flushed" not in caplog.text and "are zero" not in caplog.text
    assert isinstance(llm.model.layers[0].attn.o_proj.w, Nvfp4Weight)
    _compare(llm, hf, VOCAB)


def test_mxfp4_moe_experts_run_on_the_nvfp4_moe_op(tmp_path):
    hf, tensors = save_random_moe(tmp_path, "qwen3_moe")
    dequantized = _quantize_all(tensors, [n for n in tensors if n.endswith("_proj.weight")])
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _write_config(tmp_path)
    load_dequantized(hf, dequantized)
    llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    assert llm.model.layers[1].mlp.experts.nvfp4
    _compare(llm, hf, VOCAB)


def test_conversion_is_exact_within_17_octaves_and_flushes_below(gen, caplog):
    w = torch.randn((4, 128), generator=gen).clamp(-2.9, 2.9)
    w[:, ::32] = 3.0  # every block's amax 3: one shared exponent, 2**-1
    w[1, :32] *= 2.0 ** -17  # 17 octaves below the largest blocks' scale: still held (e4m3's 2**-9)
    w[2, 32:64] *= 2.0 ** -30  # far below: flushed
    w[3, 64:96] = 0  # an all-zero block's scale is irrelevant
    packed, e8m0 = mxfp4_quantize(w)
    want = mxfp4_dequantize(packed, e8m0)
    with caplog.at_level("WARNING", logger="engine"):
        got = dense_weight(mxfp4_as_nvfp4(packed, e8m0, "w"), torch.float32)
    assert "1 of 16 MXFP4 blocks" in caplog.text, caplog.text
    flushed = torch.zeros_like(want, dtype=torch.bool)
    flushed[2, 32:64] = True
    assert torch.equal(got[~flushed], want[~flushed]) and torch.all(got[flushed] == 0)
    assert want[1, :32].abs().max() > 0 and torch.equal(got[1, :32], want[1, :32])


def test_unsupported_quark_configs_are_named(tmp_path):
    from engine.core.loader import ModelLoadError
    from engine.core.loader.hf_quark import quark_scheme

    with pytest.raises(ModelLoadError, match="not OCP MXFP4"):
        quark_scheme({**QUARK, "global_quant_config": {"weight": {**MXFP4, "group_size": 16}}}, "m")
    mixed = {**QUARK, "layer_quant_config": {"*down_proj": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}}}}
    with pytest.raises(ModelLoadError, match="quantized unlike the rest"):
        quark_scheme(mixed, "m")
    with pytest.raises(ModelLoadError, match="dtype 'int4' is not supported"):
        quark_scheme({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "int4"}}}, "m")
    with pytest.raises(ModelLoadError, match="NaN"):
        mxfp4_as_nvfp4(torch.ones((1, 16), dtype=torch.uint8), torch.full((1, 1), 255, dtype=torch.uint8), "w")
