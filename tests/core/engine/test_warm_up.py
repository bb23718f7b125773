"""LLM.warm_up: the first requests' shapes run at load where the platform asks for it, leaving nothing behind."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def cold(default_model):
    return LLM(max_num_seqs=4, max_num_batched_tokens=64)


def test_off_by_default_on_the_cpu_where_nothing_compiles(cold):
    assert not cold.platform.warmup_at_load and cold.warmup_seconds is None


def test_warm_up_runs_and_changes_nothing_a_request_sees(cold):
    warm = LLM(max_num_seqs=4, max_num_batched_tokens=64, warmup=True)
    assert warm.warmup_seconds is not None and warm.warmup_seconds > 0
    bm = warm.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "the warm-up's sequences gave their blocks back"
    assert warm.engine.stats.num_steps == 0 and not warm.engine.has_unfinished()
    got = warm.generate([PROMPT], GREEDY)[0]
    want = cold.generate([PROMPT], GREEDY)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert got.num_cached_tokens == want.num_cached_tokens == 0, "random warm-up tokens are nobody's prefix"


def test_skip_warmup_flag_reaches_llm():
    import argparse

    from engine.core.cli_generate import add_model_arguments, llm_kwargs

    p = argparse.ArgumentParser()
    add_model_arguments(p)
    assert llm_kwargs(p.parse_args(["--skip-warmup"]))["warmup"] is False
    assert llm_kwargs(p.parse_args([]))["warmup"] is None  # the platform's default


def test_a_tiny_context_still_warms_up(default_model):
    assert LLM(max_model_len=6, num_kv_blocks=8, warmup=True).warmup_seconds > 0
