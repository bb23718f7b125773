"""Tool-call parsers on the formats models write: whole outputs, the same outputs cut into random pieces (a stream
must give exactly what the whole gives, markers split anywhere), and outputs that only look like calls."""

from __future__ import annotations

import json
import random

import pytest

from engine.core.serving import parsers

WEATHER = {"city": "Paris", "units": "metric; SI", "days": [1, 2]}


def whole(name: str, text: str):
    p = parsers.tool_parser(name)()
    content, calls = p.feed(text)
    more, more_calls = p.finish()
    return content + more, [(c.name, json.loads(c.arguments)) for c in calls + more_calls]


def streamed(name: str, text: str, rng: random.Random):
    p = parsers.tool_parser(name)()
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    content, calls = "", []
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        got, found = p.feed(text[a:b])
        content, calls = content + got, calls + found
    got, found = p.finish()
    return content + got, [(c.name, json.loads(c.arguments)) for c in calls + found]


CASES = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(WEATHER) + '}\n</tool_call>',
         "", [("get_weather", WEATHER)]),
        ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
         '{"name": "b", "arguments": "{\\"x\\": 1}"}\n</tool_call>', "Let me look.\n\n", [("a", {}), ("b", {"x": 1})]),
        ("No tools needed: 2 < 3 and <tool is not a tag.", "No tools needed: 2 < 3 and <tool is not a tag.", []),
        ('<tool_call>{"name": oops}</tool_call> after', '<tool_call>{"name": oops}</tool_call> after', []),
        ('<tool_call>\n{"name": "cut", "argum', '<tool_call>\n{"name": "cut", "argum', []),  # cut off: content
        ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),  # no name
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": ' + json.dumps(WEATHER) + '}, {"name": "b", '
         '"arguments": {}}]', "", [("get_weather", WEATHER), ("b", {})]),
        ('Sure. [TOOL_CALLS]get_weather[ARGS]' + json.dumps(WEATHER) + '[TOOL_CALLS]b[ARGS]{}', "Sure. ",
         [("get_weather", WEATHER), ("b", {})]),
        ("Plain [answer] with [TOOL words.", "Plain [answer] with [TOOL words.", []),
        ("[TOOL_CALLS][{bad json", "[TOOL_CALLS][{bad json", []),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + "}", "", [("get_weather", WEATHER)]),
        ('<|python_tag|>{"name": "a", "parameters": {"q": "x;y"}}; {"name": "b", "parameters": {}}', "",
         [("a", {"q": "x;y"}), ("b", {})]),
        ('The answer is {"name": "x"}', 'The answer is {"name": "x"}', []),
        ('{"not": "a call"}', '{"not": "a call"}', []),
        ('{"name": "cut", "parameters": {"a"', '{"name": "cut", "parameters": {"a"', []),
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_outputs(name):
    for text, content, calls in CASES[name]:
        assert whole(name, text) == (content, calls), text


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stream_gives_what_the_whole_gives(name):
    rng = random.Random(random.SystemRandom().randrange(2**32))
    for text, content, calls in CASES[name]:
        for _ in range(30):
            assert streamed(name, text, rng) == (content, calls), text


def test_content_streams_before_the_call_completes():
    p = parsers.tool_parser("hermes")()
    assert p.feed("Checking the weather") == ("Checking the weather", [])
    assert p.feed(" now <tool") == (" now ", [])  # '<tool' may open a call: held back
    assert p.feed('_call>{"name": "f", "arguments": {}}') == ("", [])
    content, calls = p.feed("</tool_call>")
    assert content == "" and [c.name for c in calls] == ["f"]
    assert calls[0].openai(0)["function"] == {"name": "f", "arguments": "{}"} and calls[0].id.startswith("call_")


def test_unknown_parser_names_say_what_exists():
    with pytest.raises(ValueError, match="Did you mean 'hermes'"):
        parsers.tool_parser("hermse")
    with pytest.raises(ValueError, match="known: deepseek_r1, qwen3"):
        parsers.reasoning_parser("o1")
