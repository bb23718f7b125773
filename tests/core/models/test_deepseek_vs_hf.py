"""The DeepSeek-V3 family (multi-head latent attention over a paged latent cache, grouped-routing MoE with shared
experts, YaRN): tiny random models built and saved by transformers, loaded by engine. Prompt logits match
transformers' forward pass; greedy tokens through the absorbed decode (mla_decode) match transformers' generate,
with and without decode graphs, batched, and over a prefix served from cached blocks."""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.engine.memory import kv_bytes_per_token
from engine.core.loader import ModelLoadError
from engine.core.models.deepseek_moe import grouped_topk
from engine.core.testing.random_model import write_word_tokenizer
from tests.core.models.test_tiny_random_vs_hf import _save_tokenizer

transformers = pytest.importorskip("transformers")

VOCAB = 160
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
            routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, v_head_dim=24,
            qk_nope_head_dim=20, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
            norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False)
V2 = dict(q_lora_rank=None, topk_method="greedy", n_group=1, topk_group=1)
VARIANTS = {  # name: (family, overrides)
    "v3": ("V3", {}),
    # DeepSeek-V2-Lite's shape: queries from one projection; rotary on halves; no grouping; two shared experts
    "no_q_lora": ("V3", dict(q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1, n_shared_experts=2,
                             norm_topk_prob=False, routed_scaling_factor=1.0)),
    "yarn": ("V3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                                         "mscale": 0.707, "mscale_all_dim": 0.707}, first_k_dense_replace=0)),
    # DeepSeek-V2-Lite's routing (softmax, greedy, no renormalization) and V2's grouped variant
    "v2_greedy": ("V2", V2),
    "v2_grouped": ("V2", dict(V2, q_lora_rank=48, topk_method="group_limited_greedy", n_group=4, topk_group=2)),
}


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def build(path, family="V3", **overrides):
    cfg = getattr(transformers, f"Deepseek{family}Config")(**{**BASE, **overrides})
    torch.manual_seed(_seed())
    model = getattr(transformers, f"Deepseek{family}ForCausalLM")(cfg).eval()
    with torch.no_grad():  # routers that really choose (the default init leaves the bias at zero)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 0.5)
                if hasattr(layer.mlp.gate, "e_score_correction_bias"):
                    layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    model.save_pretrained(path)
    _save_tokenizer(path)
    return model


@pytest.fixture(params=sorted(VARIANTS))
def tiny(request, tmp_path):
    family, overrides = VARIANTS[request.param]
    return request.param, build(tmp_path, family, **overrides), tmp_path


def assert_greedy_under_transformers(model, ids: list[int], tokens: list[int], name: str) -> None:
    """Each of our greedy ``tokens`` is transformers' argmax given the same context (teacher-forced in one forward
    pass), or within 1e-4 of it: random tiny models have near-ties that rounding may break either way, and then the
    two continuations part for good, so comparing whole generations would fail on a tie and not on an error."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1].float()
    best = logits.max(-1).values
    ours = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    gap = best - ours
    assert len(tokens) > 0 and bool((gap <= 1e-4).all()), f"{name}: step {int(gap.argmax())} lost by {gap.max():.2e}"


def test_prompt_logits_match_transformers(tiny):
    name, hf, path = tiny
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, block_size=16)
    ids = torch.randint(0, VOCAB, (45,), generator=torch.Generator().manual_seed(_seed())).tolist()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(llm.prompt_logits(ids).cpu(), theirs, atol=1e-4, rtol=1e-4,
                               msg=lambda m: f"{name}: {m}")
    # one latent cache a layer (kv_lora_rank 32 + rope 16 channels), no value cache, each its own memory
    caches = llm.runner.kv_caches
    assert len(caches) == 3 and all(tuple(c.shape) == (64, 16, 1, 48) for c in caches)
    assert len({c.data_ptr() for c in caches}) == 3
    assert kv_bytes_per_token(llm.config, torch.float32) == 3 * 48 * 4


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_greedy_decode_matches_transformers(tiny, eager):
    name, hf, path = tiny
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, block_size=16, enforce_eager=eager)
    gen = torch.Generator().manual_seed(_seed())
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 23, 40)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for ids, out in zip(prompts, outs, strict=True):
        assert len(out.outputs[0].token_ids) == 16
        assert_greedy_under_transformers(hf, ids, out.outputs[0].token_ids, name)


def test_a_prefix_from_cached_blocks_gives_the_same_tokens(tmp_path):
    """The second prompt's first 32 tokens (two blocks) come from the cache: its prefill attends to latent rows it
    did not compute."""
    hf = build(tmp_path)
    llm = LLM(str(tmp_path), dtype="float32", num_kv_blocks=64, block_size=16, enable_prefix_caching=True)
    gen = torch.Generator().manual_seed(_seed())
    prefix = torch.randint(0, VOCAB, (32,), generator=gen).tolist()
    first, second = prefix + [1, 2, 3], prefix + torch.randint(0, VOCAB, (9,), generator=gen).tolist()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([first], params)
    out = llm.generate([second], params)[0]
    assert out.num_cached_tokens == 32
    assert_greedy_under_transformers(hf, second, out.outputs[0].token_ids, "prefix")


@pytest.mark.parametrize("family", ["V2", "V3"])
def test_grouped_topk_matches_transformers_router(family):
    module = getattr(transformers.models, f"deepseek_{family.lower()}")
    modeling = getattr(module, f"modeling_deepseek_{family.lower()}")
    extra = dict(topk_method="group_limited_greedy") if family == "V2" else {}
    cfg = getattr(transformers, f"Deepseek{family}Config")(**{**BASE, **extra})
    router = getattr(modeling, f"Deepseek{family}TopkRouter")(cfg)
    gen = torch.Generator().manual_seed(_seed())
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen))
        bias = None
        if family == "V3":
            bias = router.e_score_correction_bias
            bias.copy_(torch.randn(8, generator=gen) * 0.3)
        x = torch.randn(50, 64, generator=gen)
        logits, want_w, want_ids = router(x)
    w, ids = grouped_topk(logits, bias, 2, 4, 2, family == "V3", 2.5, "sigmoid" if family == "V3" else "softmax")
    order, want_order = ids.argsort(-1), want_ids.argsort(-1)
    assert torch.equal(ids.gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(w.gather(1, order), want_w.gather(1, want_order))


def test_unsupported_deepseek_configs_are_refused(tmp_path):
    build(tmp_path)
    cfg_path = tmp_path / "config.json"
    text = cfg_path.read_text()
    cfg_path.write_text(text.replace('"attention_bias": false', '"attention_bias": true'))
    with pytest.raises(ModelLoadError, match="attention_bias"):
        LLM(str(tmp_path))
    cfg_path.write_text(text.replace('"model_type"', '"scoring_func": "softmax", "model_type"'))
    with pytest.raises(ModelLoadError, match="scoring_func 'softmax'"):
        LLM(str(tmp_path))


# DeepSeek-V3's attention widths (latent 512 + rope 64, nope 128, values 128) and routing (8 groups, top-4 groups,
# 8 of 64 experts), fewer and narrower layers: the Triton MLA decode and the GPU MoE path at the real head sizes.
LARGER = dict(vocab_size=4096, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
              num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=1,
              n_routed_experts=64, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=384,
              qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
              num_experts_per_tok=8, first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=2048,
              tie_word_embeddings=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the larger config runs on a CUDA GPU")
def test_larger_config_greedy_matches_transformers_on_the_gpu(tmp_path, caplog):
    cfg = transformers.DeepseekV3Config(**LARGER)
    torch.manual_seed(_seed())
    hf = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 0.05)
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    hf.save_pretrained(tmp_path)
    write_word_tokenizer(tmp_path, LARGER["vocab_size"])
    hf = hf.cuda()
    with caplog.at_level("WARNING", logger="engine"):
        llm = LLM(str(tmp_path), dtype="float32", platform="cuda", num_kv_blocks=256, block_size=64,
                  max_num_batched_tokens=2048)
    gen = torch.Generator().manual_seed(_seed())
    prompts = [torch.randint(0, 4096, (n,), generator=gen).tolist() for n in (7, 300, 1100)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for ids, out in zip(prompts, outs, strict=True):
        tokens = out.outputs[0].token_ids
        with torch.no_grad():
            logits = hf(torch.tensor([ids + tokens], device="cuda")).logits[0, len(ids) - 1:-1].float()
        gap = logits.max(-1).values - logits.gather(1, torch.tensor(tokens, device="cuda")[:, None])[:, 0]
        # fp32 on a GPU: the two sides sum in different orders (and transformers' matmuls may use TF32)
        assert len(tokens) == 24 and bool((gap <= 2e-3 * logits.std()).all()), f"lost by {gap.max():.2e}"
    assert "op mla_decode runs on its plain-torch reference" not in caplog.text, caplog.text
