"""Data parallelism on this machine's cores: two engine processes give the single engine's greedy tokens, share the
requests, carry grammars, abort, and a process killed under them fails its requests instead of hanging them."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from engine.core import plugins
from engine.core.engine.async_llm import EngineDeadError
from engine.core.engine.data_parallel import DataParallelLLM
from engine.core.engine.llm import LLM
from engine.core.engine.sampling_params import SamplingParams
from engine.core.platform import Platform

LLM_KWARGS = {"platform": "cpu", "kv_cache_bytes": 32 << 20, "max_num_seqs": 8, "max_model_len": 256}
PROMPTS = [f"Fact number {i}:" for i in range(6)]


def test_each_process_gets_its_own_cores(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    slices = [Platform().data_parallel_slice(r, len(cores)) for r in range(len(cores))]
    assert [c for _, mine in slices for c in mine] == cores and all(len(mine) == 1 for _, mine in slices)
    assert all(env["ENGINE_NUM_THREADS"] == "1" for env, _ in slices)
    with pytest.raises(ValueError, match="needs a core of its own"):
        Platform().data_parallel_slice(0, len(cores) + 1)


def test_each_process_gets_one_device(monkeypatch):
    class Accelerator(Platform):
        name = "acc"
        device_control_env_var = "ACC_VISIBLE_DEVICES"

    monkeypatch.setenv("ACC_VISIBLE_DEVICES", "3,5")
    assert Accelerator().data_parallel_slice(1, 2)[0]["ACC_VISIBLE_DEVICES"] == "5"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    with pytest.raises(ValueError, match="one acc device; 2 visible"):
        Accelerator().data_parallel_slice(0, 3)


@pytest.fixture(scope="module")
def dp(default_model):
    engine = DataParallelLLM(LLM_KWARGS, 2, plugins.activate("cpu"))
    yield engine
    engine.shutdown()


async def _run(engine, prompt, params):
    final = None
    text = []
    async for u in engine.generate(prompt, params):
        text.append(u.delta_text)
        final = u
    return "".join(text), final.output.outputs[0]


def test_two_processes_give_the_single_engines_tokens(dp):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    single = [o.outputs[0] for o in LLM(**LLM_KWARGS).generate(PROMPTS, params)]
    before = [w.requests for w in dp.workers]

    async def main():
        return await asyncio.gather(*[_run(dp, p, params) for p in PROMPTS])

    got = asyncio.run(main())
    assert [o.token_ids for _, o in got] == [o.token_ids for o in single]
    assert all(text == o.text for text, o in got)
    assert all(w.requests - b >= 2 for w, b in zip(dp.workers, before, strict=True))  # both served
    assert dp.is_running and dp.llm.max_model_len == 256


def test_grammars_travel_to_the_engine_processes(dp):
    from tests import needs

    grammar = needs.module("engine.core.serving.grammar", "pip install -e '.[serve]'")
    compiler = grammar.GrammarCompiler(dp.llm.tokenizer, dp.llm.config.vocab_size)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    params = SamplingParams(temperature=0, max_tokens=20, logits_processors=[compiler.processor(schema)])
    text, out = asyncio.run(_run(dp, "A JSON object:", params))
    import json

    assert isinstance(json.loads(text)["n"], int), text


def test_abort_ends_a_stream(dp):
    async def main():
        stream = await dp.add_request("Count:", SamplingParams(max_tokens=200, ignore_eos=True), "to-abort")
        seen = 0
        async for u in stream:
            seen += 1
            if seen == 3:
                dp.abort("to-abort")
            if u.request_finished:
                return u.output.outputs[0].finish_reason, seen

    reason, seen = asyncio.run(main())
    assert reason == "abort" and seen < 100


def test_a_killed_process_fails_its_requests(default_model):
    engine = DataParallelLLM(LLM_KWARGS, 2, plugins.activate("cpu"))
    try:
        async def main():
            stream = await engine.add_request("Count:", SamplingParams(max_tokens=240, ignore_eos=True), "doomed")
            victim = next(w for w in engine.workers if "doomed" in w.in_flight)
            start = time.monotonic()
            with pytest.raises(EngineDeadError, match=f"engine process {victim.rank} died"):
                async for u in stream:
                    if u.new_token_ids and victim.process.is_alive():
                        os.kill(victim.process.pid, signal.SIGKILL)
            return time.monotonic() - start

        assert asyncio.run(main()) < 30
        assert not engine.is_running and "died" in str(engine.error)
        with pytest.raises(EngineDeadError):
            asyncio.run(engine.add_request("hi", SamplingParams(max_tokens=2)))
    finally:
        engine.shutdown(timeout=10)
