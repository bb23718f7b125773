"""Tools and reasoning through the server on the built-in model: tool_choice auto read by the --tool-call-parser
(the tiny model writes calls by copying the format from earlier turns), required and named constrained by the
grammar library, reasoning_content, all streamed and not, and the requests that must be refused."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.core.engine.async_llm import AsyncLLM
from engine.core.engine.llm import LLM
from tests import needs
from tests.core.serving.live_server import start_server

openai = needs.module("openai")
build_app = needs.module("engine.core.serving.app", "pip install -e '.[serve]'").build_app

MODEL = "smollm2"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "today's weather in a city",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}}}]
NO_PENALTY = {"repetition_penalty": 1.0}  # the built-in model's default 1.1 stops it copying
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def copying(answer: str) -> list[dict]:
    """Messages after which the tiny model answers ``answer`` (it copies the answer of the earlier turns)."""
    ask = {"role": "user", "content": "Weather in Paris?"}
    return [{"role": "system", "content": "Answer exactly: " + answer}, ask,
            {"role": "assistant", "content": answer}, ask, {"role": "assistant", "content": answer}, ask]


@pytest.fixture(scope="module")
def urls(default_model):
    engine = AsyncLLM(LLM(kv_cache_bytes=64 << 20, max_num_seqs=16, max_model_len=1024))
    servers = {"plain": start_server(build_app(engine, MODEL)),
               "hermes": start_server(build_app(engine, MODEL, tool_call_parser="hermes", reasoning_parser="qwen3")),
               "llama3": start_server(build_app(engine, MODEL, tool_call_parser="llama3_json"))}
    yield {k: v.url for k, v in servers.items()}
    for s in servers.values():
        s.stop()
    engine.shutdown()


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def streamed(url, **kw):
    """(content, reasoning, tool calls assembled from their deltas, finish_reason) of a streamed chat."""
    content = reasoning = ""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client(url).chat.completions.create(model=MODEL, stream=True, **kw):
        d = chunk.choices[0].delta
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or ""
        for tc in d.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.id or call["id"]
            call["name"] += tc.function.name or ""
            call["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_auto_reads_the_calls_the_model_writes(urls):
    kw = dict(messages=copying(HERMES_CALL), tools=TOOLS, temperature=0, max_tokens=40, extra_body=NO_PENALTY)
    r = client(urls["hermes"]).chat.completions.create(model=MODEL, **kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None, msg
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    assert msg.tool_calls[0].id.startswith("call_") and msg.tool_calls[0].type == "function"
    content, _, calls, finish = streamed(urls["hermes"], **kw)
    assert finish == "tool_calls" and "<tool_call>" not in content and not content.strip()
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    # tool_choice none: the same output is content
    r = client(urls["hermes"]).chat.completions.create(model=MODEL, tool_choice="none", **kw)
    assert r.choices[0].message.content == HERMES_CALL and not r.choices[0].message.tool_calls


def test_a_call_written_as_a_json_answer(urls):
    """llama3_json: the answer is the call; the real model writes it under a response_format schema."""
    call = {"type": "object", "properties": {"name": {"const": "get_time"}, "parameters": {
        "type": "object", "properties": {"zone": {"const": "UTC"}}, "required": ["zone"]}},
        "required": ["name", "parameters"]}
    kw = dict(messages=[{"role": "user", "content": "What time is it?"}], tools=TOOLS, temperature=0,
              max_tokens=40, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": call}})
    msg = client(urls["llama3"]).chat.completions.create(model=MODEL, **kw).choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("get_time",
                                                                                              {"zone": "UTC"})]
    _, _, calls, finish = streamed(urls["llama3"], **kw)
    assert finish == "tool_calls" and [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_time", {"zone": "UTC"})]


@pytest.mark.parametrize("stream", [False, True])
def test_named_and_required_tool_choice_are_constrained(urls, stream):
    ask = [{"role": "user", "content": "What is the weather in Paris, and the time?"}]
    for choice, parallel in (({"type": "function", "function": {"name": "get_weather"}}, True), ("required", False),
                             ("required", True)):
        kw = dict(messages=ask, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel, temperature=0.8,
                  max_tokens=120, seed=7)
        if stream:
            content, _, calls, finish = streamed(urls["plain"], **kw)
        else:
            r = client(urls["plain"]).chat.completions.create(model=MODEL, **kw)
            content, finish = r.choices[0].message.content, r.choices[0].finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in r.choices[0].message.tool_calls]
        assert finish == "tool_calls" and not content, (choice, content)
        assert calls and (parallel or len(calls) == 1), calls
        for c in calls:
            args = json.loads(c["arguments"])
            if c["name"] == "get_weather":
                assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 20
            else:
                assert c["name"] == "get_time" and args["zone"] in ("UTC", "CET") and choice == "required"


def test_reasoning_content(urls):
    answer = "<think>The user asks about Paris.</think>It is sunny."
    kw = dict(messages=copying(answer), temperature=0, max_tokens=30, extra_body=NO_PENALTY)
    msg = client(urls["hermes"]).chat.completions.create(model=MODEL, **kw).choices[0].message
    assert (msg.reasoning_content, msg.content) == ("The user asks about Paris.", "It is sunny."), msg
    content, reasoning, _, finish = streamed(urls["hermes"], **kw)
    assert (reasoning, content, finish) == ("The user asks about Paris.", "It is sunny.", "stop")
    plain = client(urls["plain"]).chat.completions.create(model=MODEL, **kw).choices[0].message
    assert plain.content == answer  # no reasoning parser: all content


def test_tool_messages_from_earlier_turns_are_accepted(urls):
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'}]
    r = client(urls["hermes"]).chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_what_cannot_be_served_is_a_400(urls):
    ask = [{"role": "user", "content": "hi"}]
    bad = {
        "--tool-call-parser": (urls["plain"], {"tools": TOOLS}),  # auto needs a parser on the server
        "not in 'tools'": (urls["hermes"], {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                           "function": {"name": "nope"}}}),
        "needs tools": (urls["hermes"], {"tool_choice": "required"}),
        "distinct function names": (urls["hermes"], {"tools": TOOLS + TOOLS[:1]}),
        "pattern": (urls["hermes"], {"tools": [{"type": "function", "function": {"name": "a b"}}]}),
        "128": (urls["hermes"], {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}),
        "both constrain": (urls["plain"], {"tools": TOOLS, "tool_choice": "required",
                                           "response_format": {"type": "json_object"}}),
        "ignore_eos cannot be combined": (urls["plain"], {"ignore_eos": True,
                                                          "response_format": {"type": "json_object"}}),
    }
    for message, (url, extra) in bad.items():
        r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": ask, **extra}, timeout=30)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (message, r.text)
