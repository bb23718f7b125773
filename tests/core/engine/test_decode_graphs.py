"""Decode graphs: the static buffers, buckets and padding give the same tokens as eager decode.

A CPU platform whose "graph" re-runs the captured function into the captured output buffers stands in for a GPU
(captured at start-up): everything but the GPU's own capture machinery (static inputs, padding rows that write
nothing, bucket choice, the output view) is exercised for real. The CPU platform's own graphs (recorded kernel
calls, captured lazily on a bucket's second use) are tested at the end."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.engine.decode_graphs import batch_buckets
from engine.core.engine.spec_decode import SpeculativeConfig, Speculator
from engine.core.testing.random_model import write_random_llama
from engine.platforms.cpu.platform import CpuPlatform


class ReplayingCpu(CpuPlatform):
    device_graphs = True
    graph_capture_computes = False  # like a GPU: every bucket captured at start-up
    graph_max_batch = None

    def __init__(self):
        self.captures = 0
        self.replays = 0

    def capture_graph(self, fn, pool=None):
        out = fn()
        self.captures += 1

        def replay():
            self.replays += 1
            out.copy_(fn())

        return replay, out, pool


class FailingCapture(CpuPlatform):
    device_graphs = True
    graph_capture_computes = False
    graph_max_batch = None

    def capture_graph(self, fn, pool=None):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(4) == [1, 2, 4]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]


PROMPTS = [[5, 9, 100, 7], list(range(20, 45)), [300]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_random_llama(tmp_path_factory.mktemp("model"), seed=7))


@pytest.fixture
def run(model_dir):
    def _run(**kw):
        llm = LLM(model_dir, kv_cache_bytes=32 << 20, max_num_seqs=4, **kw)
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        return llm, [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]

    return _run


def test_replayed_decode_equals_eager_decode(run):
    _, eager = run(enforce_eager=True, platform="cpu")
    platform = ReplayingCpu()
    llm, graphed = run(platform=platform)
    assert platform.captures == 3 and llm.runner.graphs.bucket_for(3) == 4  # 3 sequences ride bucket 4
    assert platform.replays >= 7  # every decode step after the prefill
    assert graphed == eager


def test_a_failed_capture_falls_back_to_eager_and_says_why(caplog, run):
    with caplog.at_level("WARNING", logger="engine"):
        llm, tokens = run(platform=FailingCapture())
    assert llm.runner.graphs is None
    assert "decode graphs disabled" in caplog.text and "stream is capturing" in caplog.text
    _, eager = run(enforce_eager=True, platform="cpu")
    assert tokens == eager


@pytest.mark.parametrize("n", [1, 2, 4])
def test_bucket_choice(n, model_dir):
    platform = ReplayingCpu()
    llm = LLM(model_dir, kv_cache_bytes=32 << 20, max_num_seqs=4, platform=platform)
    assert llm.runner.graphs.bucket_for(n) == n
    assert llm.runner.graphs.bucket_for(5) is None


class FailingLazyCapture(CpuPlatform):
    def capture_graph(self, fn, pool=None):
        fn()  # stops after doing part of the work, as a refused capture does
        raise RuntimeError("a CPU graph cannot capture item")


def _long_run(llm, prompts, n=12):
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_cpu_graphs_are_captured_lazily_and_replay_the_eager_tokens(model_dir):
    eager = _long_run(LLM(model_dir, kv_cache_bytes=32 << 20, platform="cpu", enforce_eager=True), PROMPTS)
    llm = LLM(model_dir, kv_cache_bytes=32 << 20, platform="cpu")
    graphs = llm.runner.graphs
    assert graphs is not None and graphs.lazy and not graphs.graphs  # nothing captured at start-up
    assert graphs.buckets == [1, 2, 4, 8, 16, 24, 32]  # CpuPlatform.graph_max_batch
    assert graphs.bucket_for(33) is None
    calls = []
    forward = graphs._forward
    graphs._forward = lambda key: calls.append(key) or forward(key)
    assert _long_run(llm, PROMPTS) == eager
    assert list(graphs.graphs) == [4]  # 3 sequences ride bucket 4: eager first, then captured, then replayed
    assert calls == [4, 4]  # the later 9 decode steps replayed without running the model's Python
    assert _long_run(llm, PROMPTS[:1]) == eager[:1]
    assert sorted(graphs.graphs) == [1, 4]
    graphs.forget()  # captured again: new logits memory, which what run() returns must follow
    assert _long_run(llm, PROMPTS) == eager and list(graphs.graphs) == [4]


def test_cpu_graphs_replay_batches_above_8_as_eager(model_dir):
    # 12 and 30 sequences ride buckets 16 and 32 (captured since the 32-request benchmark's decode steps spent ~10%
    # of their time in the model's Python): the same tokens as eager.
    prompts = [[(7 * i + j) % 500 + 1 for j in range(3 + i % 5)] for i in range(30)]
    eager = _long_run(LLM(model_dir, kv_cache_bytes=32 << 20, platform="cpu", enforce_eager=True), prompts, n=6)
    llm = LLM(model_dir, kv_cache_bytes=32 << 20, platform="cpu")
    assert _long_run(llm, prompts[:12], n=6) == eager[:12]
    assert _long_run(llm, prompts, n=6) == eager
    assert sorted(llm.runner.graphs.graphs) == [16, 32]


def test_a_failed_lazy_capture_falls_back_to_eager_and_says_why(caplog, model_dir):
    eager = _long_run(LLM(model_dir, kv_cache_bytes=32 << 20, platform="cpu", enforce_eager=True), PROMPTS)
    with caplog.at_level("WARNING", logger="engine"):
        llm = LLM(model_dir, kv_cache_bytes=32 << 20, platform=FailingLazyCapture())
        assert _long_run(llm, PROMPTS) == eager
    assert "decode graphs disabled" in caplog.text and "cannot capture item" in caplog.text
    assert llm.runner.graphs.bucket_for(1) is None and not llm.runner.graphs.graphs


class RecordingOnlyCpu(ReplayingCpu):
    """Like a GPU's capture, this one only records: the outputs it hands back hold garbage until a replay."""

    def __init__(self):
        super().__init__()
        self.verify_captures = 0

    def capture_graph(self, fn, pool=None):
        replay, out, pool = super().capture_graph(fn, pool)
        if out.shape[0] > 4:  # more rows than sequences: a verify graph
            self.verify_captures += 1
        out.fill_(float("nan"))
        return replay, out, pool


class Oracle:
    """Drafts k tokens of the known greedy continuation, the last one wrong every third step (rejections too)."""

    def __init__(self, continuation: dict[tuple[int, ...], list[int]]):
        self.continuation, self.steps = continuation, 0

    def propose(self, items):
        self.steps += 1
        drafts = {}
        for seq, k in items:
            done = len(seq.output_token_ids)
            d = list(self.continuation[tuple(seq.prompt_token_ids)][done:done + k])
            if d and self.steps % 3 == 0:
                d[-1] = (d[-1] + 1) % 500
            drafts[seq.seq_id] = d
        return drafts, None


def test_verify_steps_replay_where_captures_only_record(model_dir):
    """Speculative verify steps on a platform whose captures compute nothing (GPUs): a (bucket, rows) graph is
    captured on its key's second use and replayed for that step's logits, and the greedy tokens are plain
    decoding's."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(model_dir, kv_cache_bytes=32 << 20, max_num_seqs=4, enforce_eager=True, platform="cpu")
    want = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params)]
    platform = RecordingOnlyCpu()
    llm = LLM(model_dir, kv_cache_bytes=32 << 20, max_num_seqs=4, platform=platform)
    oracle = Oracle({tuple(p): w for p, w in zip(PROMPTS, want, strict=True)})
    llm.engine.speculator = Speculator(SpeculativeConfig(method="draft_model", num_speculative_tokens=3),
                                       llm.scheduler, oracle)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS * 2, params)]
    assert got == want * 2
    graphs = llm.runner.graphs
    assert graphs.verify_disabled is None and graphs.verify_graphs and platform.verify_captures
    # what they hold counts against VERIFY_GRAPH_BYTES: here (no capture report) their logits
    assert graphs.verify_bytes == sum(x.numel() * x.element_size() for _, x in graphs.verify_graphs.values()) > 0
    stats = llm.engine.speculator.stats.totals()
    assert stats["accepted"] < stats["drafted"]
