"""``engine serve``'s app on the default model, through the openai client and raw httpx: streaming and not,
chat and completions, n > 1, logprobs, json_schema, every bad input, disconnects, and 64 concurrent streams."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time

import httpx
import pytest

from engine.core.engine.async_llm import AsyncLLM
from engine.core.engine.llm import LLM
from tests import needs
from tests.core.serving.live_server import start_server

openai = needs.module("openai")
build_app = needs.module("engine.core.serving.app", "pip install -e '.[serve]'").build_app  # needs fastapi

MODEL = "smollm2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}
N_CONCURRENT = 64


@pytest.fixture(scope="module")
def served(default_model):
    llm = LLM(kv_cache_bytes=96 << 20, max_num_seqs=64, max_model_len=512)
    # A request's fields left out take the model's defaults (the built-in model: repetition_penalty 1.1), as
    # LLM.get_default_sampling_params does offline.
    greedy = dataclasses.replace(llm.get_default_sampling_params(), temperature=0, max_tokens=8)
    prompts = [f"Fact number {i}:" for i in range(N_CONCURRENT)]
    ref = {"chat": llm.chat(QUESTION, dataclasses.replace(greedy, max_tokens=12))[0].outputs[0].text,
           "prompts": prompts, "texts": [o.outputs[0].text for o in llm.generate(prompts, greedy)]}
    engine = AsyncLLM(llm, max_queue=256)
    running = start_server(build_app(engine, MODEL))
    yield running.url, engine, ref
    running.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0)


def _pool_whole(engine, wait_s: float = 10.0) -> bool:
    import time

    bm = engine.llm.block_manager
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if engine.num_running == 0 and engine.num_waiting == 0 and bm.num_free_blocks == bm.num_blocks:
            return True
        time.sleep(0.02)
    return False


def test_models_health_and_chat(served, client):
    url, engine, ref = served
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(url + "/health").status_code == 200
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    assert r.choices[0].message.content == ref["chat"] and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_with_usage(served, client):
    _, _, ref = served
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref["chat"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_completions_stream_and_not(served, client):
    _, _, ref = served
    whole = client.completions.create(model=MODEL, prompt=ref["prompts"][0], temperature=0, max_tokens=8)
    assert whole.choices[0].text == ref["texts"][0] and whole.usage.prompt_tokens > 0
    streamed = client.completions.create(model=MODEL, prompt=ref["prompts"][0], temperature=0, max_tokens=8,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ref["texts"][0]


def test_n_completions_and_logprobs(served, client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", n=3, temperature=1.0, seed=5,
                                  max_tokens=6, logprobs=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    for c in r.choices:
        assert len(c.logprobs.token_logprobs) == len(c.logprobs.tokens) and all(lp <= 0 for lp in
                                                                               c.logprobs.token_logprobs)
        assert all(1 <= len(t) <= 3 for t in c.logprobs.top_logprobs)  # top 2, plus the sampled one if not in it
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=4,
                                          logprobs=True, top_logprobs=3, n=2)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens // 2
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in content)


def test_json_schema_output_parses_and_validates(served, client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], temperature=0,
        max_tokens=60, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"} and isinstance(obj["name"], str) and len(obj["name"]) <= 12
    assert isinstance(obj["age"], int)
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0.7, seed=3, max_tokens=80,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":  # a cut-off object is not valid JSON; a finished one must be
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_logit_bias_forces_and_forbids_tokens(served, client):
    _, engine, ref = served
    tok = engine.llm.tokenizer
    forced = tok.encode(" banana", add_special_tokens=False)[0]
    r = client.completions.create(model=MODEL, prompt=ref["prompts"][0], temperature=0, max_tokens=3,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == tok.decode([forced] * 3)
    greedy = tok.encode(ref["texts"][0], add_special_tokens=False)[0]  # the unbiased greedy first token
    r = client.completions.create(model=MODEL, prompt=ref["prompts"][0], temperature=0, max_tokens=1,
                                  logit_bias={str(greedy): -100})
    assert r.choices[0].text and tok.encode(r.choices[0].text, add_special_tokens=False)[0] != greedy


def _body(**kw):
    return json.dumps({"model": MODEL, **kw}).encode()


LONG = "word " * 600
BAD = [
    ("/v1/completions", b'{"model": "smollm2", "prompt": ', 400, None),
    ("/v1/completions", b'{"model": "smollm2", "prompt": "\xff\xfe"}', 400, None),
    ("/v1/completions", _body(prompt="hi", max_tokens="many"), 400, "max_tokens"),
    ("/v1/completions", _body(prompt=["a", 3]), 400, None),
    ("/v1/completions", json.dumps({"model": "gpt-4", "prompt": "hi"}).encode(), 404, "model"),
    ("/v1/completions", _body(prompt=LONG), 400, "prompt"),
    ("/v1/completions", _body(prompt="hi", max_tokens=600), 400, "max_tokens"),
    ("/v1/completions", _body(prompt="hi", n=99), 400, "n"),
    ("/v1/completions", _body(prompt="hi", logprobs=21), 400, "logprobs"),
    ("/v1/completions", _body(prompt=[10**9]), 400, "prompt"),
    ("/v1/completions", _body(prompt="hi", echo=True), 400, "echo"),
    ("/v1/chat/completions", _body(messages=QUESTION, logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    ("/v1/chat/completions", _body(messages=[]), 400, "messages"),
    ("/v1/chat/completions", _body(messages=[{"role": "wizard", "content": "x"}]), 400, None),
    ("/v1/chat/completions", _body(messages=QUESTION, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}), 400, None),
    ("/v1/chat/completions", _body(messages=QUESTION, temperature=-1), 400, "temperature"),
    ("/v1/completions", _body(prompt="hi", logit_bias={"ten": 1}), 400, "logit_bias"),
    ("/v1/completions", _body(prompt="hi", logit_bias={"10": 101}), 400, "logit_bias"),
    ("/v1/completions", _body(prompt="hi", logit_bias={str(10**7): 1}), 400, "logit_bias"),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    # a torch.Generator takes at most 2**64 - 1: larger seeds once killed the engine thread (and every request after)
    ("/v1/completions", _body(prompt="hi", seed=2**64), 400, "seed"),
    ("/v1/completions", _body(prompt="hi", seed=-(2**63) - 1), 400, "seed"),
    ("/v1/completions", _body(prompt="hi", seed=2**64 - 1, n=2), 400, None),  # seed + 1 overflows: said, no param
    ("/v1/completions", _body(prompt=["a"] * 257), 400, "prompt"),  # one request may not flood the queue
    ("/v1/completions", _body(prompt="hi", stop=["a"] * 10000), 400, "stop"),
    ("/v1/completions", _body(prompt="hi", stop="x" * 5000), 400, "stop"),
    ("/v1/completions", _body(prompt="hi", stop_token_ids=list(range(5000))), 400, "stop_token_ids"),
    ("/v1/chat/completions", _body(messages=[{"role": "user", "content": None}]), 400, "messages"),
]


def test_bad_requests_get_4xx_and_do_not_disturb_a_running_stream(served):
    url, engine, ref = served

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            async def good():
                body = {"model": MODEL, "prompt": ref["prompts"][1], "temperature": 0, "max_tokens": 8,
                        "stream": True}
                text = ""
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            text += json.loads(line[6:])["choices"][0]["text"]
                return text

            async def bad(path, body):
                return await http.post(path, content=body, headers={"content-type": "application/json"})

            return await asyncio.gather(good(), *(bad(p, b) for p, b, _, _ in BAD))

    text, *responses = asyncio.run(main())
    assert text == ref["texts"][1]
    for (_path, body, status, param), r in zip(BAD, responses, strict=True):
        assert r.status_code == status, (body[:80], r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"]
        if param:
            assert (err["param"] or "").startswith(param), (body[:80], err)
    assert _pool_whole(engine)


def test_not_json_oversized_unknown_routes_and_wrong_methods_get_openai_errors(served):
    url, engine, _ = served
    body = _body(prompt="hi", max_tokens=2)
    with httpx.Client(base_url=url, timeout=30) as http:
        cases = [
            (http.post("/v1/completions", content=body, headers={"content-type": "text/plain"}), 415),
            (http.post("/v1/completions", data={"prompt": "hi", "model": MODEL}), 415),  # a form
            (http.post("/v1/completions", content=b"x" * (9 << 20), headers={"content-type": "application/json"}),
             413),
            (http.get("/v1/no-such-route"), 404),
            (http.get("/v1/completions"), 405),
        ]
        for r, status in cases:
            assert r.status_code == status, r.text
            err = r.json()["error"]
            assert err["message"] and err["type"], err
        assert http.get("/health").status_code == 200
    assert _pool_whole(engine)


def test_queue_full_is_503_with_retry_after(served):
    url, engine, _ = served
    engine.max_queue = 0
    try:
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    finally:
        engine.max_queue = 256
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "server_error"


def test_disconnect_mid_stream_returns_the_blocks(served):
    url, engine, _ = served
    # Once the stream has a token, the engine waits for the client to disconnect before its next step: on a busy
    # machine the client thread could otherwise read its first line only after all 400 tokens were made. In about
    # one run in five here (2026-12-07) the request is gone after its first event, before the client disconnects
    # (no engine step after the prefill, nothing running or waiting): not yet explained. The disconnect is then
    # tried again, up to three times, so the path under test runs.
    for _ in range(3):
        aborted_before = _aborted_count(url)
        if _disconnect_after_the_first_event(url, engine):
            break
        assert _pool_whole(engine), "a request that ended early kept its KV blocks"
    else:
        pytest.fail("three requests in a row ended after their first event, before the client disconnected")
    assert _pool_whole(engine), "the disconnected request kept running or kept its KV blocks"
    for _ in range(100):  # the handler counts it as it unwinds, after the engine freed the blocks
        if _aborted_count(url) >= aborted_before + 1:
            break
        time.sleep(0.05)
    assert _aborted_count(url) >= aborted_before + 1, "a request aborted by its client is counted in /metrics"


def _disconnect_after_the_first_event(url, engine) -> bool:
    """Stream a long completion, read its first event, disconnect; True if the request was still live (running or
    waiting) when the client left."""
    body = {"model": MODEL, "prompt": "Write a very long story.", "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": True}
    resume, step = threading.Event(), engine.engine.step

    def step_after_disconnect():
        if any(s.output_token_ids for s in engine.engine.scheduler.running):
            resume.wait(timeout=60)
        return step()

    engine.engine.step = step_after_disconnect
    try:
        with httpx.Client(timeout=60) as http, http.stream("POST", url + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    break
            assert '"finish_reason":null' in line, f"first event {line[:300]!r}"
            return engine.num_running + engine.num_waiting >= 1
    finally:
        resume.set()
        del engine.engine.step


def _aborted_count(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    lines = [ln for ln in text.splitlines()
             if ln.startswith("engine_requests_total{") and 'finish_reason="abort"' in ln]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_disconnect_while_waiting_for_a_whole_response_aborts_it(served):
    url, engine, _ = served
    body = {"model": MODEL, "prompt": "Write a very long story.", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    assert _pool_whole(engine), "the abandoned request kept running or kept its KV blocks"


def test_concurrent_streams_match_offline_greedy(served):
    url, engine, ref = served

    async def one(http, prompt):
        body = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 8, "stream": True}
        text = ""
        async with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
        return text

    async def main():
        limits = httpx.Limits(max_connections=N_CONCURRENT)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
            return await asyncio.gather(*(one(http, p) for p in ref["prompts"]))

    assert asyncio.run(main()) == ref["texts"]
    assert _pool_whole(engine)
    metrics = httpx.get(url + "/metrics").text
    for name in ("engine_num_requests_running", "engine_num_requests_waiting", "engine_kv_cache_usage_perc",
                 "engine_prefix_cache_hit_rate", "engine_time_to_first_token_seconds_count",
                 "engine_inter_token_latency_seconds_count", "engine_generation_tokens_per_second"):
        assert name in metrics
    ttft = next(line for line in metrics.splitlines() if line.startswith("engine_time_to_first_token_seconds_count"))
    assert float(ttft.split()[-1]) >= N_CONCURRENT


def test_api_key(served):
    _, engine, _ = served
    running = start_server(build_app(engine, MODEL, api_key="sekret"))
    try:
        assert httpx.get(running.url + "/v1/models").status_code == 401
        assert httpx.get(running.url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=running.url + "/v1", api_key="nope", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=running.url + "/v1", api_key="sekret", max_retries=0)
        assert ok.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(running.url + "/health").status_code == 200  # health needs no key
    finally:
        running.stop()


def test_request_fields_left_out_take_the_models_defaults():
    from engine.core.serving.protocol import CompletionRequest

    model = {"repetition_penalty": 1.1, "temperature": 0.6}
    req = CompletionRequest(model=MODEL, prompt="x")
    sp = req.sampling_params(8, None, [], model)
    assert (sp.repetition_penalty, sp.temperature, sp.top_p) == (1.1, 0.6, 1.0)  # top_p: the API's default
    req = CompletionRequest(model=MODEL, prompt="x", temperature=1.0, repetition_penalty=1.0)
    sp = req.sampling_params(8, None, [], model)
    assert (sp.repetition_penalty, sp.temperature) == (1.0, 1.0)  # given fields win, even at the API's default
    assert CompletionRequest(model=MODEL, prompt="x").sampling_params(8, None, []).repetition_penalty == 1.0
