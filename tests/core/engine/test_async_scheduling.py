"""Async scheduling (LLMEngine.async_scheduling): a step's outputs come one step late, and every output equals the
synchronous engine's — greedy and seeded tokens, stops on a token (whose extra computed token is discarded),
stop strings, length limits, logprobs, penalties, preemption, prefix caching, abort — eager and through decode
graphs. The host runs it for real: the placeholder tokens are -1, so an input id the eager runner failed to take
from the previous step's device tokens would fail the embedding lookup (through graphs, it would change tokens)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.engine.scheduler import PLACEHOLDER
from engine.core.testing.random_model import write_random_llama
from engine.platforms.cpu.platform import CpuPlatform

from .test_decode_graphs import ReplayingCpu

PROMPTS = [[5, 9, 100, 7], list(range(20, 45)), [300], list(range(60, 71))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_random_llama(tmp_path_factory.mktemp("model"), seed=11))


def _outputs(llm, params, prompts=PROMPTS):
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs) for c in o.outputs]
            for o in llm.generate(prompts, params)]


def _pair(model_dir, params, prompts=PROMPTS, **kw):
    """(sync outputs, async outputs, the async LLM) for the same requests."""
    kw = {"kv_cache_bytes": 32 << 20, "max_num_seqs": 4, "max_num_batched_tokens": 16, **kw}
    sync = _outputs(LLM(model_dir, async_scheduling=False, **kw), params, prompts)
    llm = LLM(model_dir, async_scheduling=True, **kw)
    return sync, _outputs(llm, params, prompts), llm


def _assert_idle(llm):
    assert not llm.engine.has_unfinished() and llm.engine._inflight is None
    assert llm.block_manager.num_free_blocks == llm.runner.num_blocks


def test_the_platform_decides_the_default(model_dir):
    from engine.platforms.cuda.platform import CudaPlatform

    assert CudaPlatform.async_scheduling and not CpuPlatform.async_scheduling
    assert not LLM(model_dir, kv_cache_bytes=8 << 20, platform="cpu").engine.async_scheduling
    assert LLM(model_dir, kv_cache_bytes=8 << 20, platform="cpu", async_scheduling=True).engine.async_scheduling


def test_outputs_arrive_one_step_late(model_dir):
    llm = LLM(model_dir, kv_cache_bytes=8 << 20, async_scheduling=True)
    llm.engine.add_request(PROMPTS[1], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert llm.engine.step() == []  # the prefill was launched; its token is read during the next step
    seq = llm.scheduler.running[0]
    assert seq.output_token_ids == [PLACEHOLDER]
    first = llm.engine.step()
    assert len(first) == 1 and first[0].new_token_ids[0] != PLACEHOLDER
    assert seq.output_token_ids[0] == first[0].new_token_ids[0] and seq.output_token_ids[1] == PLACEHOLDER
    llm.engine.step()  # the third token's step: the length limit finishes it before its token is known
    assert seq.is_finished and llm.engine.has_unfinished()
    last = llm.engine.step()
    assert last[0].finished and len(last[0].output.outputs[0].token_ids) == 3
    _assert_idle(llm)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_greedy_tokens_equal_the_synchronous_engine(model_dir, graphs):
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (9, 3, 12, 1)]
    kw = {"platform": ReplayingCpu()} if graphs else {}
    sync, out, llm = _pair(model_dir, params, **kw)
    assert out == sync
    if graphs:
        assert llm.platform.replays > 5
    _assert_idle(llm)


def test_requests_joining_and_leaving_reorder_the_device_inputs(model_dir):
    # Six requests through four slots with staggered lengths: later steps' batches are not the previous ones in
    # order, so the input ids are gathered from the previous step's tokens by row (the graph path's index copy).
    prompts = PROMPTS + [[7, 8, 9], list(range(100, 109))]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (2, 7, 4, 9, 5, 3)]
    sync, out, llm = _pair(model_dir, params, prompts, platform=ReplayingCpu())
    assert out == sync
    _assert_idle(llm)


def test_a_stop_token_discards_the_token_computed_meanwhile(model_dir):
    free = _outputs(LLM(model_dir, kv_cache_bytes=32 << 20), SamplingParams(temperature=0, max_tokens=12,
                                                                           ignore_eos=True))
    # Stop each request on its own 4th greedy token (the first occurrence of it), and one on its last allowed one.
    params = []
    for (tokens, *_), m in zip((o[0] for o in free), (12, 12, 12, 4), strict=True):
        params.append(SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, stop_token_ids=[tokens[3]]))
    sync, out, llm = _pair(model_dir, params)
    assert out == sync
    assert [o[0][2] for o in out] == ["stop"] * 4  # the last one: its stop token is also its length limit
    assert all(o[0][3] is not None for o in out)
    _assert_idle(llm)


def test_stop_strings_and_eos(model_dir):
    free = _outputs(LLM(model_dir, kv_cache_bytes=32 << 20), SamplingParams(temperature=0, max_tokens=10))
    stop = free[1][0][1].split()[2]  # a word the second completion produces
    params = SamplingParams(temperature=0, max_tokens=10, stop=[stop])
    sync, out, llm = _pair(model_dir, params)
    assert out == sync and out[1][0][2] == "stop" and out[1][0][3] == stop
    _assert_idle(llm)


def test_seeded_sampling_logprobs_and_n(model_dir):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=3, max_tokens=6, logprobs=3, n=2,
                            ignore_eos=True)
    sync, out, llm = _pair(model_dir, params)
    assert out == sync
    assert all(len(c[4]) == 6 for o in out for c in o)
    _assert_idle(llm)


def test_penalties_fall_back_to_synchronous_steps(model_dir):
    params = [SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.5, frequency_penalty=0.5,
                             ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * 2
    sync, out, llm = _pair(model_dir, params)
    assert out == sync
    _assert_idle(llm)


def test_preemption_and_prefix_caching(model_dir):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    alone = [_outputs(LLM(model_dir, kv_cache_bytes=8 << 20), params, [p])[0] for p in PROMPTS]
    llm = LLM(model_dir, num_kv_blocks=6, block_size=8, max_num_seqs=4, async_scheduling=True)
    assert _outputs(llm, params) == alone
    assert llm.engine.num_preemptions > 0, "the cache was meant to be too small for all requests at once"
    _assert_idle(llm)
    cached = LLM(model_dir, kv_cache_bytes=8 << 20, block_size=4, async_scheduling=True)
    first = _outputs(cached, params)
    again = cached.generate([p + t for p, t in zip(PROMPTS, (o[0][0] for o in first), strict=True)],
                            SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    # The generated tokens' blocks were registered with their real values: a prompt continuing them hits every
    # full block up to the last generated token (sampled, never computed).
    assert first == alone
    assert [o.num_cached_tokens for o in again] == [(len(p) + 9) // 4 * 4 for p in PROMPTS]


def test_stops_under_preemption(model_dir):
    # A sequence preempted while its token is in flight gets that token (and may stop on it) while waiting.
    free = _outputs(LLM(model_dir, kv_cache_bytes=8 << 20), SamplingParams(temperature=0, max_tokens=14,
                                                                          ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, stop_token_ids=[o[0][0][k]])
              for o, k in zip(free, (6, 9, 3, 11), strict=True)]
    sync, out, llm = _pair(model_dir, params, num_kv_blocks=6, block_size=8, kv_cache_bytes=None)
    assert out == sync and [o[0][2] for o in out] == ["stop"] * 4
    assert llm.engine.num_preemptions > 0
    _assert_idle(llm)


def test_abort_while_a_step_is_in_flight(model_dir):
    llm = LLM(model_dir, kv_cache_bytes=8 << 20, async_scheduling=True)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    a = llm.engine.add_request(PROMPTS[0], params)
    b = llm.engine.add_request(PROMPTS[1], params)
    for _ in range(3):
        llm.engine.step()
    assert llm.engine._inflight is not None
    out = llm.abort(a)
    assert out.outputs[0].finish_reason == "abort"
    n_a = len(out.outputs[0].token_ids)
    updates = []
    while llm.engine.has_unfinished():
        updates += llm.engine.step()
    assert all(u.request_id == b for u in updates)
    assert len(out.outputs[0].token_ids) == n_a  # nothing more reached the aborted request
    assert updates[-1].finished and len(updates[-1].output.outputs[0].token_ids) == 20
    _assert_idle(llm)


def test_switching_async_off_mid_run_resolves_the_step_in_flight(model_dir):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    sync = _outputs(LLM(model_dir, kv_cache_bytes=8 << 20), params)
    llm = LLM(model_dir, kv_cache_bytes=8 << 20, async_scheduling=True)
    ids = [llm.engine.add_request(p, params) for p in PROMPTS]
    done = {}
    for i in range(30):
        if i == 3:
            llm.engine.async_scheduling = False
        for u in llm.engine.step():
            if u.request_finished:
                done[u.request_id] = u.output
        if not llm.engine.has_unfinished():
            break
    assert [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs) for c in done[i].outputs]
            for i in ids] == sync
    _assert_idle(llm)
