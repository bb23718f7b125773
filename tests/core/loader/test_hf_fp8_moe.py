"""FP8 MoE checkpoints (Qwen3-MoE and DeepSeek-V3, experts and every other linear layer quantized), written in the
test in the layouts that publish them. Per-channel and per-tensor experts with dynamic per-token activations, and
128x128-block experts with dynamic 1x128 activation groups (DeepSeek-V3, Qwen3-FP8), stay in FP8 and run on
fused_moe_fp8; static-activation experts and blocks that do not tile the matrix are expanded to the model dtype with
a warning that says so. The oracle is transformers' forward pass on the dequantized weights, with the activations
of every quantized linear rounded the same way (forward hooks) and, for experts kept in FP8, transformers' own
routing feeding an expert loop that rounds the expert inputs and intermediates per token (an independent
quantizer, tests/core/loader/test_hf_fp8.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.core.models.weights import Fp8Weight
from tests.core.loader.test_hf_fp8 import LAYOUTS, dequantize, fake_quant_input, quantize
from tests.core.models.test_tiny_random_vs_hf import VOCAB, _save_tokenizer

transformers = pytest.importorskip("transformers")

MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        intermediate_size=256, moe_intermediate_size=256, num_experts=4, num_experts_per_tok=2, head_dim=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        intermediate_size=256, moe_intermediate_size=256, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.0, kv_lora_rank=64, q_lora_rank=96,
        qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32, first_k_dense_replace=1)),
}
KEPT = ("ct_channel_token", "fbgemm_channel", "deepseek_block", "ct_block_group")  # experts that stay FP8
QUANTIZED = ("_proj.weight",)  # every projection but the router (mlp.gate.weight) and lm_head


def _fp8_experts_forward(experts, acts):
    """Qwen3MoeExperts / DeepseekV3Experts forward with W8A8 arithmetic: inputs and the SwiGLU intermediate rounded
    to FP8 per token before each GEMM (weights already dequantized in the module)."""
    def forward(hidden_states, top_k_index, top_k_weights):
        x = fake_quant_input(hidden_states, acts)
        out = torch.zeros_like(hidden_states)
        for t in range(x.shape[0]):
            for k in range(top_k_index.shape[1]):
                e = int(top_k_index[t, k])
                gate, up = (x[t] @ experts.gate_up_proj[e].t()).chunk(2)
                h = fake_quant_input((torch.nn.functional.silu(gate) * up)[None], acts)[0]
                out[t] += top_k_weights[t, k] * (h @ experts.down_proj[e].t())
        return out
    return forward


def save_random_moe(tmp_path, model: str, vocab: int = VOCAB):
    """A random 2-layer MoE model of MODELS[model] saved by transformers in tmp_path with a tokenizer: (the model,
    its saved tensors, per-expert names, to quantize and write back)."""
    cfg_cls, model_cls, extra = MODELS[model]
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    cfg = getattr(transformers, cfg_cls)(vocab_size=vocab, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-6,
                                         tie_word_embeddings=False, **extra)
    hf = getattr(transformers, model_cls)(cfg).eval()
    hf.save_pretrained(tmp_path)
    _save_tokenizer(tmp_path)
    return hf, load_file(tmp_path / "model.safetensors")


def build(tmp_path, model: str, layout: str):
    weights_how, acts, qc = LAYOUTS[layout]
    hf, tensors = save_random_moe(tmp_path, model)
    scale_name = "weight_scale_inv" if qc["quant_method"] == "fp8" else "weight_scale"
    dequantized = {}
    for name in [n for n in tensors if n.endswith(QUANTIZED)]:
        q, s = quantize(tensors[name].float(), weights_how)
        base = name.removesuffix("weight")
        tensors[name], tensors[base + scale_name] = q, s
        if not isinstance(acts, str):
            tensors[base + "input_scale"] = torch.tensor([acts])
        dequantized[name] = dequantize(q, s, weights_how)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    # the oracle: dequantized weights everywhere, activations rounded where the engine rounds them
    load_dequantized(hf, dequantized, acts, fp8_experts=layout in KEPT)
    return hf


def load_dequantized(hf, dequantized: dict, acts=None, fp8_experts: bool = False) -> None:
    """Put the checkpoint's dequantized weights into transformers' model (its linears and its fused experts); with
    ``acts``, round each quantized linear's input as the engine does (and, with ``fp8_experts``, the experts')."""
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            p = f"model.layers.{i}."
            for name, module in layer.named_modules():
                if isinstance(module, torch.nn.Linear) and p + name + ".weight" in dequantized:
                    module.weight.copy_(dequantized[p + name + ".weight"])
                    # MLA absorbs kv_b_proj: its dequantized weight meets no activation
                    if acts is not None and name != "self_attn.kv_b_proj":
                        module.register_forward_pre_hook(lambda m, args, how=acts: (fake_quant_input(args[0], how),))
            experts = getattr(layer.mlp, "experts", None)
            if experts is None:
                continue
            for e in range(experts.gate_up_proj.shape[0]):
                g, u, d = (dequantized[f"{p}mlp.experts.{e}.{n}_proj.weight"] for n in ("gate", "up", "down"))
                experts.gate_up_proj[e].copy_(torch.cat([g, u]))
                experts.down_proj[e].copy_(d)
            if fp8_experts:
                experts.forward = _fp8_experts_forward(experts, acts)


@pytest.mark.parametrize("layout", ["ct_channel_token", "fbgemm_channel", "deepseek_block", "ct_block_group",
                                    "ct_tensor_static"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_fp8_moe_checkpoints_match_transformers(tmp_path, model, layout, caplog):
    hf = build(tmp_path, model, layout)
    with caplog.at_level("INFO", logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=32, block_size=16)
    experts = llm.model.layers[1].mlp.experts
    assert experts.fp8 == (layout in KEPT), layout
    if layout in KEPT:
        assert experts.w13.dtype == torch.float8_e4m3fn and "expanded" not in caplog.text
        blocks = "block" in layout  # 128x128: [E, 2I/128, hidden/128] and [E, hidden/128, I/128]
        assert experts.w13_scale.shape == ((4, 4, 2) if blocks else (4, 512, 1)), experts.w13_scale.shape
        assert experts.w2_scale.shape == ((4, 2, 2) if blocks else (4, 256, 1)), experts.w2_scale.shape
    else:
        assert "expert matrices (FP8" in caplog.text and "are expanded to float32" in caplog.text, caplog.text
    # the rest stays in FP8 either way (the attention projections, DeepSeek's dense first layer)
    assert isinstance(llm.model.layers[0].attn.o_proj.w, Fp8Weight)
    # As in test_hf_fp8: usually equal to fp32 rounding; an activation on either side of an FP8 rounding midpoint
    # moves one step now and then (routing can follow it), so a small mean and a bounded max.
    assert_routed_logits_close(llm, hf, (model, layout))


def assert_routed_logits_close(llm, hf, label) -> None:
    """The engine's prompt logits equal transformers' to fp32 rounding, or nearly: where a rounding the two sides
    share only in distribution moves a router input, another expert is now and then picked (a small mean error, and
    at most two of the 21 tokens' rows past a bounded max: one flipped choice moves its token's row by up to half
    the logits' spread, as a CI run found with 1x128 activation groups)."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (21,), generator=gen).tolist()
    ours = llm.prompt_logits(ids).cpu()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    err, spread = (ours - theirs).abs(), theirs.std()
    close = torch.allclose(ours, theirs, atol=2e-3, rtol=2e-3)
    rows_off = int((err.amax(-1) >= 0.15 * spread).sum())
    assert close or (err.mean() < 0.015 * spread and rows_off <= 2), (label, seed, err.mean() / spread,
                                                                      err.max() / spread, rows_off)


def test_which_fp8_experts_are_expanded_and_why():
    from engine.core.loader.hf_loader import _expand_reason

    def w(rows, cols, scale_shape, act_group=128, input_scale=None):
        return Fp8Weight(torch.zeros(rows, cols, dtype=torch.float8_e4m3fn), torch.ones(scale_shape), act_group,
                         input_scale)

    assert _expand_reason(w(256, 512, (2, 4))) is None  # whole blocks, 1x128 groups: fused_moe_fp8 takes them
    assert "not whole blocks" in _expand_reason(w(160, 512, (2, 4)))  # I = 160 (a gate/up seam inside a block)
    assert "1x128 dynamic activation groups" in _expand_reason(w(256, 512, (2, 4), act_group=0))
    assert "1x128 dynamic activation groups" in _expand_reason(w(256, 512, (2, 4), input_scale=torch.tensor(0.1)))
    assert _expand_reason(w(160, 512, (160, 1), act_group=0)) is None  # per channel, per token
    assert "static" in _expand_reason(w(160, 512, (160, 1), act_group=0, input_scale=torch.tensor(0.1)))
