"""LLM(tensor_parallel_size=2) on the CPU: two ranks over gloo (this process and one worker it starts), greedy tokens
equal to one rank's, with chunked prefill, a batch, and n-gram speculation; a dead worker ends the next step with an
error naming it; close() stops the worker."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.engine.tensor_parallel import TensorParallelError, _rank_slice

PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "Repeat after me: one two three four five six seven eight nine ten. " * 3]
PARAMS = SamplingParams(max_tokens=20, temperature=0.0)


@pytest.fixture(scope="module")
def one_rank(default_model):
    return LLM(max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def reference(one_rank):
    return [o.outputs[0].token_ids for o in one_rank.generate(PROMPTS, PARAMS)]


def test_two_ranks_give_one_rank_s_greedy_tokens(reference, one_rank):
    threads = torch.get_num_threads()
    llm = LLM(tensor_parallel_size=2, max_num_batched_tokens=32)  # the long prompt prefills in chunks
    try:
        # rank 0 keeps to its share of the cores, as the worker does (both on all of them contend at every collective)
        env0, _ = _rank_slice(llm.platform, 0, 2)
        assert torch.get_num_threads() == int(env0["ENGINE_NUM_THREADS"]) <= max(1, threads // 2 + threads % 2)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == reference
        ids = llm.tokenizer.encode(PROMPTS[1])  # every position's logits, all vocabulary slices gathered
        torch.testing.assert_close(llm.prompt_logits(ids), one_rank.prompt_logits(ids), atol=2e-3, rtol=1e-3)
        (worker,) = llm.model.workers
        assert worker.is_alive()
    finally:
        llm.close()
    worker.join(10)
    assert not worker.is_alive() and worker.exitcode == 0
    assert torch.get_num_threads() == threads, "close() gives this process its threads back"
    with pytest.raises(TensorParallelError, match="shut down"):
        llm.generate(PROMPTS[:1], PARAMS)


def test_speculation_over_two_ranks(reference):
    llm = LLM(tensor_parallel_size=2, max_num_batched_tokens=32,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == reference
    finally:
        llm.close()


def test_a_dead_worker_is_named_not_waited_for(default_model):
    llm = LLM(tensor_parallel_size=2)
    try:
        (worker,) = llm.model.workers
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        with pytest.raises(TensorParallelError, match="rank 1 has exited"):
            llm.generate(PROMPTS[:1], PARAMS)
    finally:
        llm.close()


def test_sizes_it_cannot_take(default_model):
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int"):
        LLM(tensor_parallel_size=0)
    # the built-in model has 3 KV heads
    with pytest.raises(ValueError, match="at most 3"):
        LLM(tensor_parallel_size=4)
