"""Verify steps replayed as CPU graphs (decode_graphs.py, keyed by batch bucket and row bucket): the same greedy
tokens as plain decoding, with every sequence verifying a different number of drafts in one step (the padding put in
front of chunks as tokens already computed, or in padding sequences), and a verify capture that fails leaves the
decode graphs alone."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.core.engine import decode_graphs
from engine.core.engine.decode_graphs import VERIFY_ROW_BUCKETS
from engine.core.engine.spec_decode import SpeculativeConfig, Speculator

PROMPTS = [
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The capital of France is",
    "Hi",  # short: at its first verify steps it can take at most a token or two of padding in front
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
            # others k: the padding of the second goes in front of the long ones.
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


def _speculate(llm, reference, seed, copies=1, k=K):
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    proposer = ScriptedProposer({tuple(p): r for p, r in zip(prompts, reference, strict=True)}, seed)
    prompts, reference = prompts * copies, reference * copies
    config = SpeculativeConfig(method="draft_model", num_speculative_tokens=k)
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
    graphs.run_verify = lambda key, *a: seen.append(key) or run_verify(key, *a)
    try:
        outs, stats, proposer = _speculate(llm, reference, seed=random.randrange(1 << 30))
    finally:
        del graphs.run_verify
    assert outs == reference
    assert stats["accepted"] > 0 and stats["drafted"] > stats["accepted"]
    assert any(len(set(lengths)) > 1 for lengths in proposer.lengths), "no step mixed draft lengths"
    assert seen[0][0] == 4  # 3 sequences ride bucket 4 (fewer once some have finished)
    assert all(b in (1, 2, 4) and rows in VERIFY_ROW_BUCKETS and rows >= b for b, rows in seen)
    # Every verify step replayed: each computes one new token a sequence (the prompts are in the prefix cache from
    # the reference run but for their last token, which every step computes anew).
    assert len(seen) == len(proposer.lengths)
    assert graphs.verify_graphs  # captured on a second use, then replayed
    # 9 sequences drafting up to 8 tokens: steps over MAX_VERIFY_ROWS rows run eagerly, the others replay.
    seen.clear()
    graphs.run_verify = lambda key, *a: seen.append(key) or run_verify(key, *a)
    try:
        outs, stats, proposer = _speculate(llm, reference, seed=random.randrange(1 << 30), copies=3, k=8)
    finally:
        del graphs.run_verify
    assert outs == reference * 3 and stats["accepted"] > 0
    assert 0 < len(seen) < len(proposer.lengths) and all(b == 16 for b, _ in seen[:1])
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_failed_verify_capture_keeps_the_decode_graphs(llm, reference, caplog):
    graphs = llm.runner.graphs
    graphs.forget()
    forward, calls = graphs._forward, {}

    def failing(key):
        calls[key] = calls.get(key, 0) + 1
        out = forward(key)  # the work is done, as a capture refused midway has done part of it
        if not isinstance(key, int) and calls[key] == 2:
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


def test_verify_graphs_stay_within_their_memory_budget(llm, reference, monkeypatch):
    graphs = llm.runner.graphs
    graphs.forget()
    _speculate(llm, reference, seed=2)
    sizes = {key: replay.fresh_bytes for key, (replay, _) in graphs.verify_graphs.items()}
    vocab = llm.config.vocab_size
    # What a capture allocated: at least its fp32 logits, far less than the weights (views of them do not count).
    assert all(rows * vocab * 4 <= size < rows * (8 << 20) for (_, rows), size in sizes.items()), sizes
    assert graphs.verify_bytes == sum(sizes.values())
    budget = sorted(sizes.values())[-2] + sorted(sizes.values())[-1] // 2  # room for about two graphs
    monkeypatch.setattr(decode_graphs, "VERIFY_GRAPH_BYTES", budget)
    graphs.forget()
    outs, _, _ = _speculate(llm, reference, seed=3)
    assert outs == reference
    assert 0 < graphs.verify_bytes <= budget and 1 <= len(graphs.verify_graphs) <= 2
    monkeypatch.setattr(decode_graphs, "VERIFY_GRAPH_BYTES", 1)  # every graph too large: verify steps run eagerly
    graphs.forget()
    outs, _, _ = _speculate(llm, reference, seed=4)
    assert outs == reference and not graphs.verify_graphs and graphs._verify_eager
    graphs._verify_eager.clear()
