"""INT4 MoE checkpoints (Qwen3-MoE and DeepSeek-V3, every projection quantized: experts, shared experts, attention),
packed in the test as GPTQ, AWQ and compressed-tensors write them: the experts stay 4-bit, repacked to GGUF blocks and
run by fused_moe_gguf, and the logits match transformers' forward pass on the dequantized weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from engine import LLM
from engine.core.models.weights import QuantizedWeight
from engine.core.ops import OPS
from engine.core.ops.gguf_quant import Q4_0, Q4_1
from tests.core.loader.test_hf_fp8_moe import assert_routed_logits_close, load_dequantized, save_random_moe
from tests.core.loader.test_hf_int4 import LAYOUTS, add_quantization_config, quantize_into

transformers = pytest.importorskip("transformers")

# DeepSeek's low-rank projections have 64 and 96 input columns: groups of 32 (or whole rows) divide them
CHECKPOINTS = [("qwen3_moe", "gptq_sym_g128"), ("qwen3_moe", "awq_g32"), ("qwen3_moe", "ct_w4a16_channel"),
               ("deepseek_v3", "gptq_asym_g32"), ("deepseek_v3", "gptq_sym_channel")]


def build(tmp_path, model: str, layout: str):
    hf, tensors = save_random_moe(tmp_path, model)
    dequantized = quantize_into(tensors, [n for n in tensors if n.endswith("_proj.weight")], layout)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    add_quantization_config(tmp_path, layout)
    load_dequantized(hf, dequantized)
    return hf


@pytest.mark.parametrize("model, layout", CHECKPOINTS)
def test_int4_moe_checkpoints_keep_their_experts_quantized_and_match_transformers(tmp_path, model, layout, caplog):
    hf = build(tmp_path, model, layout)
    with caplog.at_level("INFO", logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    assert "expanded" not in caplog.text, caplog.text
    experts = llm.model.layers[1].mlp.experts
    qtype = Q4_0 if LAYOUTS[layout][2] else Q4_1
    assert experts.gguf and experts.w13_qtype == experts.w2_qtype == qtype
    assert experts.w13.dtype == torch.uint8 and experts.w13.shape[:2] == (4, 512) and experts.w2.shape[:2] == (4, 256)
    assert isinstance(llm.model.layers[0].attn.o_proj.w, QuantizedWeight)
    # symmetric: Q4_0 holds (q - 8) * s exactly; else Q4_1's offset -z * s is rounded to fp16 (as in test_hf_int4),
    # and a router input moved by that rounding may now and then pick another expert
    assert_routed_logits_close(llm, hf, (model, layout))
    chosen = list(experts.site.chosen().values())
    assert chosen and all(fn is not OPS["fused_moe_gguf"].reference for fn in chosen)  # the cpu kernel ran
