"""HF model directories written by transformers (tiny random models): config fields, every weight, tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from engine.core.loader import load_checkpoint
from tests.core.loader.builders import CHATML, SPECIALS, VARIED_TEXTS, save_hf_tokenizer

transformers = pytest.importorskip("transformers")

BASE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}, attention_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       shared_expert_intermediate_size=24, mlp_only_layers=[1], norm_topk_prob=True)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=2)),
}


def save_tiny(arch: str, model_dir, vocab: int = 420, **save_kw):
    """A random tiny model of ``arch`` saved with save_pretrained (safetensors) plus tokenizer files."""
    cfg_cls, model_cls, extra = CASES[arch]
    cfg = getattr(transformers, cfg_cls)(vocab_size=vocab, **{**BASE, **extra})
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    model.save_pretrained(str(model_dir), **save_kw)
    save_hf_tokenizer(model_dir)
    return model


def expected_weights(model, arch: str) -> dict[str, torch.Tensor]:
    """The model's parameters under checkpoint names: transformers 5 fuses experts in memory ([E, 2I, H] gate|up,
    [E, H, I] down) but writes them per expert (Mixtral: block_sparse_moe.experts.{e}.w1/w3/w2)."""
    out = {}
    for name, t in model.state_dict().items():
        if ".mlp.experts.gate_up_proj" in name or ".mlp.experts.down_proj" in name:
            prefix = name.split(".mlp.experts.")[0]
            for e in range(t.shape[0]):
                if name.endswith("gate_up_proj"):
                    gate, up = t[e].chunk(2, dim=0)
                    parts = {"w1": gate, "w3": up} if arch == "mixtral" else {"gate_proj": gate, "up_proj": up}
                else:
                    parts = {"w2" if arch == "mixtral" else "down_proj": t[e]}
                for p, v in parts.items():
                    base = "block_sparse_moe" if arch == "mixtral" else "mlp"
                    out[f"{prefix}.{base}.experts.{e}.{p}.weight"] = v
        elif arch == "mixtral" and ".mlp.gate." in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = t
        else:
            out[name] = t
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight")
    return out


@pytest.mark.parametrize("arch", list(CASES))
def test_every_weight_and_config_field(tmp_path, arch):
    model = save_tiny(arch, tmp_path)
    ck = load_checkpoint(tmp_path)
    assert ck.format == "hf" and ck.source == str(tmp_path)
    expected = expected_weights(model, arch)
    assert set(ck.weights) == set(expected)
    for name, t in expected.items():
        torch.testing.assert_close(ck.weights[name], t, rtol=0, atol=0, msg=name)

    c, hc = ck.config, model.config
    names = set(expected)
    assert c.arch == arch if arch != "mistral" else c.arch == "llama"
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.max_position) == (
        hc.vocab_size, hc.hidden_size, hc.num_hidden_layers, hc.num_attention_heads, hc.num_key_value_heads,
        hc.max_position_embeddings)
    assert c.head_dim == (getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads)
    assert c.rms_norm_eps == hc.rms_norm_eps and c.rope_theta == hc.rope_parameters["rope_theta"]
    scaling = {k: v for k, v in hc.rope_parameters.items() if k != "rope_theta"}
    assert c.rope_scaling == (None if scaling["rope_type"] == "default" else scaling)
    assert c.tie_word_embeddings == hc.tie_word_embeddings
    assert c.attention_bias == ("model.layers.0.self_attn.q_proj.bias" in names)
    assert c.qk_norm == ("model.layers.0.self_attn.q_norm.weight" in names)
    assert c.bos_token_id == 1 and c.eos_token_ids == [2]
    if arch in ("mixtral", "qwen2_moe", "qwen3_moe"):
        experts = getattr(hc, "num_local_experts", None) or hc.num_experts
        assert (c.num_experts, c.num_experts_per_tok) == (experts, hc.num_experts_per_tok)
        assert c.moe_intermediate_size == (hc.intermediate_size if arch == "mixtral" else hc.moe_intermediate_size)
        assert c.norm_topk_prob == (True if arch == "mixtral" else hc.norm_topk_prob)
        assert c.intermediate_size == hc.intermediate_size
    if arch in ("qwen2_moe", "qwen3_moe"):
        assert (c.decoder_sparse_step, c.mlp_only_layers) == (hc.decoder_sparse_step, hc.mlp_only_layers)
        assert [c.layer_is_moe(i) for i in range(2)] == [f"model.layers.{i}.mlp.gate.weight" in names
                                                         for i in range(2)]
    if arch == "qwen2_moe":
        assert c.shared_expert_intermediate_size == hc.shared_expert_intermediate_size


def test_sharded_checkpoint_and_dtype(tmp_path):
    model = save_tiny("qwen3", tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    ck = load_checkpoint(tmp_path, dtype=torch.bfloat16)
    expected = expected_weights(model, "qwen3")
    assert set(ck.weights) == set(expected)
    for name, t in expected.items():
        assert ck.weights[name].dtype == torch.bfloat16
        torch.testing.assert_close(ck.weights[name], t.to(torch.bfloat16), rtol=0, atol=0, msg=name)


def test_tokenizer_and_chat_template_match_transformers(tmp_path):
    save_tiny("llama", tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "bos_token_id": 1}))
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    # transformers' own save_pretrained layout (chat_template.jinja next to tokenizer files) in a second directory
    resaved = tmp_path / "resaved"
    ref.save_pretrained(str(resaved))
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (resaved / name).write_bytes((tmp_path / name).read_bytes())
    for model_dir in (tmp_path, resaved):
        tok = load_checkpoint(model_dir).tokenizer
        for text in VARIED_TEXTS:
            ids = tok.encode(text)
            assert ids == ref.encode(text), text
            for skip in (True, False):
                assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 123"}]
        for gen in (True, False):
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == ref.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen)
        assert tok.chat_template == CHATML
        assert tok.eos_token_ids == {2, 0}  # tokenizer eos + generation_config's stop ids
        assert tok.bos_token_id == ref.bos_token_id == SPECIALS.index("<|im_start|>")
        assert tok.special_tokens["eos_token"] == "<|im_end|>"
    assert (resaved / "chat_template.jinja").is_file()  # so the second pass read the template from there
