"""Verify steps replayed as CPU graphs (decode_graphs.py, keyed by bucket and q = k + 1): the same greedy tokens as
plain decoding, with every sequence verifying a different number of drafts in one step (chunks filled from the
front with tokens already computed), sequences too short for that run eagerly, and a verify capture that fails
leaves the decode graphs alone."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.core.engine.spec_decode import SpeculativeConfig, Speculator

PROMPTS = [
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The capital of France is",
    "Hi",  # short: its first verify step cannot fill a chunk of q tokens from the front
]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
K = 4
pytestmark = pytest.mark.usefixtures("default_model")


class ScriptedProposer:
    """Drafts the known greedy continuation, a different number of tokens per sequence and step (1..k), with a
    wrong token now and then so that some drafts are rejected and rolled back."""

    def __init__(self, continuation: dict[tuple[int, ...], list[int]], seed: int):
        self.continuation, self.rng = continuation, random.Random(seed)
        self.lengths: list[tuple[int, ...]] = []  # the draft lengths of each step
        self.turns: dict[int, int] = {}  # proposals made for each sequence

    def propose(self, items):
        drafts = {}
        for seq, k in items:
            ref = self.continuation[tuple(seq.prompt_token_ids)]
            done = len(seq.output_token_ids)
            # The first two times (with its prefill, then its first decode step), the short prompt drafts 1 and the
            # others k: at the second it is too short to fill a chunk of k + 1 from the front.
            turn = self.turns[seq.seq_id] = self.turns.get(seq.seq_id, 0) + 1
            n = (1 if len(seq.prompt_token_ids) < 3 else k) if turn <= 2 else self.rng.randint(1, k)
            d = ref[done:done + n]
            if d and self.rng.random() < 0.3:
                d[-1] = (d[-1] + 1) % 49152
            drafts[seq.seq_id] = d
        self.lengths.append(tuple(sorted(len(d) for d in drafts.values())))
        return drafts, None


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_bytes=32 << 20, block_size=4)


@pytest.fixture(scope="module")
def reference(llm):
    return _tokens(llm.generate(PROMPTS, GREEDY))


def _speculate(llm, reference, seed):
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    proposer = ScriptedProposer({tuple(p): r for p, r in zip(prompts, reference, strict=True)}, seed)
    config = SpeculativeConfig(method="draft_model", num_speculative_tokens=K)
    llm.engine.speculator = Speculator(config, llm.scheduler, proposer)
    try:
        outs = _tokens(llm.generate(prompts, GREEDY))
        stats = llm.engine.speculator.stats.totals()
    finally:
        llm.engine.speculator = None
    return outs, stats, proposer


def test_verify_steps_replay_graphs_and_keep_the_greedy_tokens(llm, reference):
    graphs = llm.runner.graphs
    assert graphs is not None and graphs.verify_disabled is None
    seen = []
    run_verify = graphs.run_verify
    graphs.run_verify = lambda b, q, *a: seen.append((b, q)) or run_verify(b, q, *a)
    try:
        outs, stats, proposer = _speculate(llm, reference, seed=random.randrange(1 << 30))
    finally:
        del graphs.run_verify
    assert outs == reference
    assert stats["accepted"] > 0 and stats["drafted"] > stats["accepted"]
    assert any(len(set(lengths)) > 1 for lengths in proposer.lengths), "no step mixed draft lengths"
    assert len(seen) >= 3 and seen[0][0] == 4  # 3 sequences ride bucket 4 (fewer once some have finished)
    assert all(b in (1, 2, 4) and 2 <= q <= K + 1 for b, q in seen)
    assert len(seen) < len(proposer.lengths) - 1  # the prefill step and the short prompt's next: eager
    assert graphs.verify_graphs  # captured on a second use, then replayed
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_failed_verify_capture_keeps_the_decode_graphs(llm, reference, caplog):
    graphs = llm.runner.graphs
    graphs.forget()
    forward, calls = graphs._forward, {}

    def failing(b, q=1):
        calls[b, q] = calls.get((b, q), 0) + 1
        out = forward(b, q)  # the work is done, as a capture refused midway has done part of it
        if q > 1 and calls[b, q] == 2:
            raise RuntimeError("a CPU graph cannot capture item")
        return out

    graphs._forward = failing
    try:
        with caplog.at_level("WARNING", logger="engine"):
            outs, _, _ = _speculate(llm, reference, seed=1)
            assert _tokens(llm.generate(PROMPTS, GREEDY)) == reference  # plain decoding: its graphs replay
    finally:
        del graphs._forward
    assert outs == reference
    assert "verify graphs disabled" in caplog.text and "cannot capture item" in caplog.text
    assert graphs.verify_disabled and not graphs.verify_graphs
    assert graphs.disabled is None and graphs.graphs
    graphs.verify_disabled = None  # the module's llm is shared: verify graphs on again
