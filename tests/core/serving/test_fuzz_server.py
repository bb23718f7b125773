"""Fuzzing the server: hypothesis draws request bodies (valid, out of range, wrong types, extra fields) for every POST
route and sends them to a live server on the built-in model. Nothing it sends may get a 5xx, the server stays
healthy, and every KV block is back in the pool afterwards.

``ENGINE_FUZZ_EXAMPLES`` sets the requests per route (CI: 120; the issue's goal of 10,000 is a manual run).
Anything found is kept as an ``@example`` below.
"""

from __future__ import annotations

import json
import os

import pytest

from tests import needs

hypothesis = needs.module("hypothesis")
httpx = needs.module("httpx")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.core.engine.async_llm import AsyncLLM  # noqa: E402
from engine.core.engine.llm import LLM  # noqa: E402
from tests.core.serving.live_server import start_server  # noqa: E402

MODEL = "smollm2"
EXAMPLES = int(os.environ.get("ENGINE_FUZZ_EXAMPLES", "120"))
pytestmark = pytest.mark.usefixtures("default_model")

def _mostly(usual, wild):
    """``usual`` 7 times in 8, else ``wild``: most requests reach the engine, every edge is still drawn."""
    return st.integers(0, 7).flatmap(lambda pick: usual if pick else wild)


ints = _mostly(st.integers(0, 5), st.one_of(st.integers(-3, 12), st.integers(-(2**70), 2**70),
                                            st.sampled_from([2**63, 2**64, -(2**63) - 1])))
floats = _mostly(st.floats(0, 1.5), st.one_of(st.floats(-3, 3), st.floats(allow_nan=True, allow_infinity=True)))
junk = st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
token_ids = st.lists(_mostly(st.integers(0, 49151), st.integers(-5, 2**40)), min_size=0, max_size=12)
prompts = _mostly(st.one_of(st.text(max_size=60), token_ids, st.lists(st.text(max_size=20), max_size=4),
                            st.lists(token_ids, max_size=3)), junk)


def _field(values):
    """A field's value: of its type 7 times in 8, else anything."""
    return _mostly(values, junk)


SAMPLING = {
    "max_tokens": _field(st.one_of(st.integers(-2, 6), st.sampled_from([10**6]))),
    "temperature": _field(floats), "top_p": _field(floats), "top_k": _field(ints), "min_p": _field(floats),
    "n": _field(st.integers(-1, 4)), "seed": _field(ints), "presence_penalty": _field(floats),
    "frequency_penalty": _field(floats), "repetition_penalty": _field(floats),
    "stop": _field(st.one_of(st.text(max_size=6), st.lists(st.text(max_size=6), max_size=5))),
    "stop_token_ids": _field(token_ids), "ignore_eos": _field(st.booleans()), "stream": st.booleans(),
    "stream_options": _field(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "logit_bias": _field(st.dictionaries(st.one_of(st.integers(-5, 2**40).map(str), st.text(max_size=4)), floats,
                                         max_size=3)),
    "response_format": _field(st.one_of(st.just({"type": "json_object"}), st.just({"type": "text"}),
                                        st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.just(
                                            {"name": "x", "schema": {"type": "integer"}})}))),
    "model": st.one_of(st.just(MODEL), st.just(MODEL), st.text(max_size=6)),
    "unknown_field": junk,
}


def _body(drawn: dict) -> dict:
    """The drawn fields, with the served model unless a model was drawn (a missing model is a 400 too, rarer)."""
    return {"model": MODEL, **drawn}


completion_bodies = st.fixed_dictionaries(
    {"prompt": prompts}, optional={**SAMPLING, "logprobs": _field(ints), "echo": _field(st.booleans())})
messages = st.lists(st.fixed_dictionaries(
    {"role": _mostly(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), st.text(max_size=5)),
     "content": _mostly(st.text(max_size=40), st.one_of(st.none(), st.integers(), st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10)}), max_size=2)))}),
    max_size=3)
names = _mostly(st.sampled_from(["get_weather", "get_time", "f"]), st.text(max_size=70))
schemas = _mostly(st.sampled_from([{"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}},
                                   {"type": "object"}, {}]),
                  st.one_of(st.sampled_from([{"type": "integer"}, {"type": "nonsense"}, {"$ref": "#/nowhere"},
                                             {"type": "object", "required": ["x"], "properties": {}}]), junk))
tools = st.lists(st.fixed_dictionaries(
    {"type": _mostly(st.just("function"), junk),
     "function": _mostly(st.fixed_dictionaries({"name": names}, optional={"parameters": schemas,
                                                                         "description": st.text(max_size=10)}),
                         junk)}), max_size=3)
tool_choices = st.one_of(st.sampled_from(["none", "auto", "required"]), st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": names})}), junk)
tool_call_messages = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.none(), "tool_calls": st.lists(st.fixed_dictionaries(
        {"id": st.text(max_size=6), "type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": names, "arguments": st.one_of(st.just('{"city": "Paris"}'), st.text(max_size=10))})}),
        max_size=2)})
chat_bodies = st.fixed_dictionaries(
    {"messages": _mostly(st.lists(st.one_of(messages, tool_call_messages.map(lambda m: [m])), max_size=2).map(
        lambda parts: [m for part in parts for m in part]), junk)},
    optional={**SAMPLING, "logprobs": _field(st.booleans()), "top_logprobs": _field(ints),
              "max_completion_tokens": _field(st.integers(-1, 6)), "tools": _field(tools),
              "tool_choice": tool_choices, "parallel_tool_calls": _field(st.booleans()),
              "chat_template_kwargs": _field(st.dictionaries(
                  st.one_of(st.sampled_from(["enable_thinking", "messages", "bos_token"]), st.text(max_size=6)),
                  st.one_of(st.booleans(), junk), max_size=3))})


@pytest.fixture(scope="module", params=["in_process", "engine_process"])
def server(request):
    """The server with its engine in its own process (``--engine-process on``, the GPU default: the data-parallel
    path with one process) and in the server's process (the CPU default)."""
    kwargs = dict(kv_cache_bytes=32 << 20, max_num_seqs=16, max_model_len=96)
    if request.param == "engine_process":
        from engine.core import plugins
        from engine.core.engine.data_parallel import DataParallelLLM

        platform = plugins.activate()
        engine = DataParallelLLM({**kwargs, "platform": platform.name}, 1, platform, max_queue=4096)
    else:
        engine = AsyncLLM(LLM(**kwargs), max_queue=4096)
    from engine.core.serving.app import build_app

    running = start_server(build_app(engine, MODEL, tool_call_parser="hermes", reasoning_parser="qwen3"))
    with httpx.Client(base_url=running.url, timeout=120) as http:
        yield http, engine
    running.stop()
    engine.shutdown()


def _post(http, path: str, body) -> httpx.Response:
    data = json.dumps(body, allow_nan=True).encode()  # NaN and Infinity too, as Python's clients may send them
    with http.stream("POST", path, content=data, headers={"content-type": "application/json"}) as r:
        r.read()
    return r


def _check(http, engine, path: str, body) -> None:
    r = _post(http, path, body)
    assert r.status_code < 500, (path, body, r.status_code, r.text[:500])
    if r.status_code == 200 and body.get("stream") is True:
        assert "data: [DONE]" in r.text or '"error"' in r.text, r.text[-300:]
    assert engine.is_running, (path, body)


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@SETTINGS
@given(body=completion_bodies)
@example(body={"prompt": "hi", "model": MODEL, "seed": 2**64})  # once killed the engine for good
@example(body={"prompt": "hi", "model": MODEL, "max_tokens": 2, "temperature": float("nan")})
@example(body={"prompt": ["a"] * 300, "model": MODEL, "max_tokens": 1})
def test_fuzz_completions(server, body):
    http, engine = server
    _check(http, engine, "/v1/completions", _body(body))


@SETTINGS
@given(body=chat_bodies)
@example(body={"messages": [{"role": "user", "content": None}], "model": MODEL})
@example(body={"messages": [{"role": "user", "content": "hi"}], "model": MODEL, "max_tokens": 2,
               "response_format": {"type": "json_object"}, "stream": True})
@example(body={"messages": [{"role": "assistant", "content": None, "tool_calls": []}], "ignore_eos": True,
               "response_format": {"type": "json_object"}})  # 500: the grammar asked past its stop token (10k run)
@example(body={"messages": [{"role": "user", "content": "hi"}], "model": MODEL, "max_tokens": 3,
               "tool_choice": "required",
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]})
def test_fuzz_chat(server, body):
    http, engine = server
    _check(http, engine, "/v1/chat/completions", _body(body))


def test_after_the_fuzzing_the_server_is_healthy_and_the_pool_whole(server):
    import time

    http, engine = server
    assert http.get("/health").status_code == 200
    deadline = time.monotonic() + 30
    while not (engine.num_running == 0 and engine.num_waiting == 0 and engine.kv_cache_usage == 0):
        assert time.monotonic() < deadline, "KV blocks leaked by the fuzzed requests"
        time.sleep(0.05)
