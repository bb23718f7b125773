"""Speculative decoding on an accelerator platform (decode graphs for plain steps, verify steps replaying graphs
captured on a (bucket, rows) key's second use):
greedy tokens equal non-speculative decoding on a random-weight model, with n-gram and with a draft model, and the
KV pool is whole afterwards. Skipped where torch sees no accelerator (CI's CPU host); run on the GPU machine."""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.testing.random_model import write_random_llama

pytestmark = pytest.mark.skipif(not torch.accelerator.is_available(), reason="needs an accelerator")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("target"), seed=int.from_bytes(os.urandom(4), "little"))


def _prompts():
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    phrase = torch.randint(3, 512, (12,), generator=gen).tolist()
    return [phrase * 4, torch.randint(3, 512, (30,), generator=gen).tolist(), phrase * 2 + [7, 8]]


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3},
                                  {"method": "draft_model", "num_speculative_tokens": 2}])
def test_speculative_greedy_equals_plain_greedy(model_dir, spec):
    if spec["method"] == "draft_model":
        spec = dict(spec, model=str(model_dir))  # the target drafting for itself
    llm = LLM(str(model_dir), dtype="float32", num_kv_blocks=64, block_size=16, max_num_seqs=8,
              speculative_config=spec)
    assert llm.runner.graphs is not None, "decode graphs were meant to be on"
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = _prompts()
    speculator, llm.engine.speculator = llm.engine.speculator, None
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    llm.engine.speculator = speculator
    spec_out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert spec_out == plain
    assert speculator.stats.totals().get("drafted", 0) > 0
    graphs = llm.runner.graphs
    assert graphs.verify_disabled is None, graphs.verify_disabled
    if spec["method"] == "draft_model":  # it drafts at every step: its keys come back, so they are captured
        assert graphs.verify_graphs
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
    sampled = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=3))
    assert all(len(o.outputs[0].token_ids) == 20 for o in sampled)
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks
