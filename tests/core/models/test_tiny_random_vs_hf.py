"""Tiny random models of every supported family, built and saved by transformers, loaded by engine:
the logits match transformers' own forward pass."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from engine import LLM, SamplingParams

transformers = pytest.importorskip("transformers")

VOCAB = 160
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=96, rope_theta=10000.0)),
    "llama-bias": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=96, attention_bias=True)),
    "llama3-rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        intermediate_size=96, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(intermediate_size=96, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(intermediate_size=96)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(intermediate_size=96, head_dim=32)),
    "tied": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=96, tie_word_embeddings=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(intermediate_size=48, num_local_experts=4,
                                                            num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
}


def _save_tokenizer(path):
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(params=sorted(FAMILIES))
def tiny_model(request, tmp_path):
    cfg_cls, model_cls, extra = FAMILIES[request.param]
    cfg = getattr(transformers, cfg_cls)(**{**COMMON, **extra})
    torch.manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    model = getattr(transformers, model_cls)(cfg).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    _save_tokenizer(tmp_path)
    return request.param, model, tmp_path


def test_logits_match_transformers(tiny_model):
    name, hf, path = tiny_model
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, block_size=16)
    gen = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    ids = torch.randint(0, VOCAB, (37,), generator=gen).tolist()
    ours = llm.prompt_logits(ids)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    # on whichever platform the machine selects (cuda on a GPU machine); HF runs on the CPU
    torch.testing.assert_close(ours.cpu(), theirs, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_two_tensor_parallel_ranks_match_transformers(tiny_model):
    """Every family (MoE experts and shared experts split by their intermediate size, biases, q/k norm, tied
    embeddings) over two CPU ranks: the same logits as transformers."""
    name, hf, path = tiny_model
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, block_size=16, platform="cpu", tensor_parallel_size=2)
    try:
        gen = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
        ids = torch.randint(0, VOCAB, (37,), generator=gen).tolist()
        ours = llm.prompt_logits(ids)
    finally:
        llm.close()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_sliding_window_caps_the_context(tmp_path):
    cfg = transformers.MistralConfig(**{**COMMON, "intermediate_size": 96, "sliding_window": 48})
    transformers.MistralForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    _save_tokenizer(tmp_path)
    llm = LLM(str(tmp_path), num_kv_blocks=16)
    assert llm.max_model_len == 48
    with pytest.raises(ValueError, match="context holds 48"):
        llm.generate(list(range(60)))


def test_replayed_decode_steps_give_the_eager_tokens(tiny_model):
    """Every family's decode path (MoE routing, q/k norm, biases, tied embeddings) replays correctly where a
    platform records decode graphs by running them (the CPU: recorded kernel calls)."""
    name, _, path = tiny_model
    gen = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 19, 2)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    runs = {}
    for eager in (True, False):
        llm = LLM(str(path), dtype="float32", num_kv_blocks=64, block_size=16, enforce_eager=eager)
        runs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        runs[eager] += [o.outputs[0].token_ids for o in llm.generate(prompts[:1], params)]
    if not llm.platform.graph_capture_computes:
        pytest.skip(f"platform {llm.platform.name} captures its graphs at start-up (tests/core/engine covers it)")
    assert sorted(llm.runner.graphs.graphs) == [1, 4], name  # both buckets were captured and replayed
    assert runs[False] == runs[True], name
