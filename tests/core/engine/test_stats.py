"""EngineStats as LLMEngine fills it: per-step token counts and KV occupancy, per-request timing, summaries."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.engine.stats import EngineStats, percentiles

BLOCK, BUDGET = 4, 8


@pytest.fixture(scope="module")
def llm(default_model):
    # step-by-step timings: with async scheduling (cuda's default) a token is stamped when read back, a step later
    return LLM(kv_cache_bytes=16 << 20, block_size=BLOCK, max_num_batched_tokens=BUDGET, enable_prefix_caching=False,
               async_scheduling=False)


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def test_percentiles_match_torch_quantile(gen):
    rng = random.Random(gen.initial_seed())
    xs = [rng.expovariate(1.0) for _ in range(rng.randint(1, 200))]
    got = percentiles(xs)
    want = torch.quantile(torch.tensor(xs, dtype=torch.float64), torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
    assert [got["p50"], got["p90"], got["p99"]] == pytest.approx(want.tolist(), rel=1e-12, abs=1e-15)
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_one_chunked_request_step_by_step(llm, gen):
    rng = random.Random(gen.initial_seed())
    p, o = rng.randint(BUDGET + 1, 4 * BUDGET), rng.randint(2, 6)
    llm.engine.stats.reset()
    out = llm.generate(_prompt(rng, p, llm.config.vocab_size), SamplingParams(temperature=0, max_tokens=o,
                                                                               ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == o
    st = llm.engine.stats
    chunks = [min(BUDGET, p - i) for i in range(0, p, BUDGET)]
    # Tokens held during each step: the prompt so far, then one more per decode step.
    held = [min(p, BUDGET * (k + 1)) for k in range(len(chunks))] + [p + k for k in range(1, o)]
    steps = list(st.steps)
    assert [s.num_prefill_tokens for s in steps] == chunks + [0] * (o - 1)
    assert [s.num_decode_tokens for s in steps] == [0] * len(chunks) + [1] * (o - 1)
    assert [s.kv_slots_used for s in steps] == held
    assert [s.kv_slots_allocated for s in steps] == [math.ceil(h / BLOCK) * BLOCK for h in held]
    wastes = [1 - h / (math.ceil(h / BLOCK) * BLOCK) for h in held]
    assert st.kv_waste_max == pytest.approx(max(wastes))
    durations = [s.duration for s in steps]
    assert all(d > 0 for d in durations)
    weighted = sum(w * d for w, d in zip(wastes, durations, strict=True))
    assert st.kv_waste_mean == pytest.approx(weighted / sum(durations))
    assert st.prefill_time == pytest.approx(sum(durations[:len(chunks)]))
    assert st.decode_time == pytest.approx(sum(durations[len(chunks):]))
    assert st.prefill_tok_per_s == pytest.approx(p / st.prefill_time)
    assert st.decode_tok_per_s == pytest.approx((o - 1) / st.decode_time)

    (req,) = st.finished
    assert (req.num_prompt_tokens, req.num_output_tokens) == (p, o)
    first_token_step = steps[len(chunks) - 1]
    assert req.first_token == pytest.approx(first_token_step.start + first_token_step.duration)
    assert req.finish == pytest.approx(steps[-1].start + steps[-1].duration)
    assert req.arrival <= steps[0].start
    assert req.tpot == pytest.approx((req.finish - req.first_token) / (o - 1))


def test_summary_over_staggered_requests(llm, gen):
    rng = random.Random(gen.initial_seed())
    vocab = llm.config.vocab_size
    # A one-token prompt is prefill too, though nothing before it is cached.
    lens = [(1, rng.randint(1, 5))] + [(rng.randint(1, 2 * BUDGET), rng.randint(1, 5)) for _ in range(3)]
    engine = llm.engine
    engine.stats.reset()
    ids = [engine.add_request(_prompt(rng, p, vocab), SamplingParams(temperature=0, max_tokens=o, ignore_eos=True))
           for p, o in lens[:2]]
    engine.step()
    engine.step()
    mid = time.perf_counter()
    ids += [engine.add_request(_prompt(rng, p, vocab), SamplingParams(temperature=0, max_tokens=o, ignore_eos=True))
            for p, o in lens[2:]]  # arrive while the first two run
    while engine.has_unfinished():
        engine.step()
    st = engine.stats
    s = st.summary()
    assert s["num_finished_requests"] == 4
    assert s["prefill_tokens"] == sum(p for p, _ in lens)
    assert s["decode_tokens"] == sum(o - 1 for _, o in lens)
    assert s["decode_only_tokens"] <= s["decode_tokens"]
    assert s["num_steps"] == len(st.steps)
    assert sum(r.num_prefill_tokens for r in st.steps) == s["prefill_tokens"]
    assert s["busy_time_s"] == pytest.approx(s["prefill_time_s"] + s["decode_time_s"])
    by_id = {r.request_id: r for r in st.finished}
    assert sorted(by_id) == sorted(ids)
    for rid, (p, o) in zip(ids, lens, strict=True):
        r = by_id[rid]
        assert (r.num_prompt_tokens, r.num_output_tokens) == (p, o)
        assert r.arrival < r.first_token <= r.finish
        assert (r.tpot is None) == (o == 1)
    assert all(by_id[i].arrival < mid for i in ids[:2]) and all(by_id[i].arrival > mid for i in ids[2:])
    for key in ("ttft_s", "tpot_s", "latency_s"):
        q = s[key]
        if q["p50"] is not None:
            assert 0 < q["p50"] <= q["p90"] <= q["p99"]
    assert s["latency_s"]["p99"] == pytest.approx(max(r.latency for r in st.finished), rel=0.05)
    assert 0 <= s["kv_waste_mean"] <= s["kv_waste_max"] < 1


def test_reset_keeps_requests_in_flight(llm, gen):
    rng = random.Random(gen.initial_seed())
    engine = llm.engine
    rid = engine.add_request(_prompt(rng, 3, llm.config.vocab_size),
                             SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    engine.step()
    engine.stats.reset()
    assert engine.stats.num_steps == 0 and not engine.stats.finished
    while engine.has_unfinished():
        engine.step()
    (r,) = engine.stats.finished
    assert r.request_id == rid and r.num_output_tokens == 3
    assert engine.stats.prefill_tokens == 0 and engine.stats.decode_tokens == 2


def test_bad_history_size_is_rejected():
    with pytest.raises(ValueError, match="max_history"):
        EngineStats(max_history=0)
