"""The parsers against the chat templates real models ship (tests/core/serving/real_chat_templates.py): what a
template renders as an assistant's tool-call turn, which is what that model learned to write, must parse back into
the same calls with the parser named for that model; the tools a request sends must reach the prompt; the reasoning
parsers must read where the template leaves the <think> block (opened by DeepSeek-R1's prompt, closed by Qwen3's when
thinking is off through chat_template_kwargs). Arguments are drawn fresh each run (quotes, unicode, nesting)."""

from __future__ import annotations

import json
import random

import pytest

from engine.core.loader.chat_template import render_chat_template
from engine.core.serving import parsers, tool_choice
from engine.core.serving.chat_output import OutputParsing
from engine.core.serving.handlers import with_call_ids
from engine.core.serving.parsers.tool_calls import mistral_call_id
from engine.core.serving.protocol import ChatCompletionRequest
from tests.core.serving.real_chat_templates import template

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<｜end▁of▁sentence｜>")

# template -> (the tool-call parser for that model, how many calls one turn may hold, its reasoning parser)
TOOL_TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", 3, None),
    "Qwen-Qwen3-0.6B": ("hermes", 3, "qwen3"),  # its turn opens with a (here empty) <think> block
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("hermes", 3, None),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", 3, None),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3_json", 1, None),  # the template refuses two calls in a turn
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3_json", 1, None),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3_json", 1, None),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", 3, None),
}


@pytest.fixture
def rng():
    return random.Random(random.SystemRandom().randrange(2**32))


def word(rng) -> str:
    alphabet = "abcxyz ÄéØ漢字🙂\"'\\/{}[]<>:,-_0123456789"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))


def drawn_tools_and_calls(rng, n_calls: int):
    """Up to three functions with drawn parameter names and a turn of ``n_calls`` calls with drawn arguments
    (strings with JSON's and the templates' special characters, numbers, booleans, nested objects and lists)."""
    tools, calls = [], []
    for i in range(rng.randint(n_calls, 3) if n_calls > 1 else 1):
        params = {f"p{j}_{rng.choice('abc')}": rng.choice(["string", "number", "boolean", "object", "array"])
                  for j in range(rng.randint(1, 4))}
        tools.append({"type": "function", "function": {
            "name": f"tool_{i}_{rng.choice(['get', 'set', 'find'])}", "description": f"does {word(rng)}",
            "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in params.items()}}}})
    for k in range(n_calls):
        fn = rng.choice(tools)["function"]
        args = {}
        for name, spec in fn["parameters"]["properties"].items():
            kind = spec["type"]
            args[name] = {"string": lambda: word(rng), "number": lambda: rng.choice([rng.randint(-99, 99), 0.5]),
                          "boolean": lambda: rng.random() < 0.5, "object": lambda: {"k": word(rng), "n": [1, 2]},
                          "array": lambda: [word(rng), rng.randint(0, 9)]}[kind]()
        calls.append({"id": f"call_{k}{rng.randrange(10**6)}", "type": "function",
                      "function": {"name": fn["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
    return tools, calls


def render(tpl: str, body: dict, add_generation_prompt: bool, call_ids=None) -> str:
    req = ChatCompletionRequest.model_validate({"model": "m", **body})
    messages = [m.template_message() for m in req.messages]
    if call_ids is not None:
        messages = [with_call_ids(m, call_ids) for m in messages]
    tools = tool_choice.template_tools(req)
    return render_chat_template(tpl, messages, add_generation_prompt, SPECIALS,
                                **({"tools": tools} if tools else {}), **(req.chat_template_kwargs or {}))


def assistant_turn(tpl: str, tools, calls, call_ids=None) -> tuple[str, str]:
    """(the prompt, the assistant's tool-call turn as the template writes it, end-of-turn marker removed)."""
    ask = [{"role": "user", "content": "Please use the tools."}]  # no system message: Mistral's templates put it in
    # the last user message only while that one ends the conversation
    prompt = render(tpl, {"tools": tools, "messages": ask}, True, call_ids)
    whole = render(tpl, {"tools": tools, "messages": ask + [
        {"role": "assistant", "content": None, "tool_calls": calls}]}, False, call_ids)
    assert whole.startswith(prompt), "the template renders the same conversation two ways"
    turn = whole[len(prompt):].rstrip()
    for marker in END_OF_TURN:
        turn = turn.removesuffix(marker).rstrip()
    return prompt, turn


def parse_streamed(parser_name: str, text: str, rng, reasoning: str | None = None, prompt: str = ""):
    """(reasoning, content, calls) of ``text`` streamed in random pieces through the server's chat output parsing."""
    parsing = OutputParsing(reasoning=parsers.reasoning_parser(reasoning) if reasoning else None,
                            tools=parsers.tool_parser(parser_name), prompt=prompt)
    out = parsing.choice()
    deltas, i = [], 0
    while i < len(text):
        j = i + rng.randint(1, 7)
        deltas.append(out.feed(text[i:j]))
        i = j
    deltas.append(out.finish())
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content", "") for d in deltas),
            [c for d in deltas for c in d.get("tool_calls", [])])


@pytest.mark.parametrize("name", sorted(TOOL_TEMPLATES))
def test_a_templated_tool_call_turn_parses_back_into_its_calls(name, rng):
    parser_name, most, reasoning = TOOL_TEMPLATES[name]
    tpl = template(name)
    ids = getattr(parsers.tool_parser(parser_name), "template_call_id", None)
    for _ in range(5):
        tools, calls = drawn_tools_and_calls(rng, rng.randint(1, most))
        prompt, turn = assistant_turn(tpl, tools, calls, ids)
        for tool in tools:  # the request's tools reach the prompt the model sees
            desc = tool["function"]["description"]
            assert tool["function"]["name"] in prompt and (desc in prompt or json.dumps(desc)[1:-1] in prompt
                                                           or json.dumps(desc, ensure_ascii=False)[1:-1] in prompt)
        thought, content, parsed = parse_streamed(parser_name, turn, rng, reasoning, prompt)
        assert thought.strip() == "" and content.strip() == "", (turn, thought, content)
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == \
            [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls], turn


def test_mistral_templates_take_the_ids_the_server_gives_them(rng):
    """Mistral's templates refuse ids other than 9 letters and digits (OpenAI clients send 'call_...'): the mistral
    parser's ids are of that form, and a conversation's earlier ids are mapped to it, a call and its result alike."""
    tpl = template("mistralai-Mistral-Nemo-Instruct-2407")
    tools, calls = drawn_tools_and_calls(rng, 2)
    history = {"tools": tools, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": calls},
        *[{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]]}
    with pytest.raises(ValueError, match="alphanumeric strings with length 9"):
        render(tpl, history, True)
    text = render(tpl, history, True, mistral_call_id)
    for c in calls:
        assert text.count(mistral_call_id(c["id"])) == 2  # the call and its result
    _, _, parsed = parse_streamed("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}]', rng)
    call_id = parsed[0]["id"]
    assert len(call_id) == 9 and call_id.isalnum() and mistral_call_id(call_id) == call_id


# ------------------------------------------------------------------------------------------------------- reasoning


def reasoning_of(parser_name: str, prompt: str, output: str) -> tuple[str, str]:
    p = parsers.reasoning_parser(parser_name)()
    p.seen_prompt(prompt)
    r1, c1 = p.feed(output)
    r2, c2 = p.finish()
    return (r1 + r2).strip(), (c1 + c2).strip()


ASK = {"messages": [{"role": "user", "content": "2+2?"}]}


@pytest.mark.parametrize("parser_name", ["qwen3", "deepseek_r1"])
def test_reasoning_follows_where_the_template_leaves_the_think_block(parser_name):
    qwen3, r1 = template("Qwen-Qwen3-0.6B"), template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")
    thinking = render(qwen3, ASK, True)  # Qwen3 writes <think> itself
    assert reasoning_of(parser_name, thinking, "<think>\nadd\n</think>\n\n4") == ("add", "4")
    off = render(qwen3, {**ASK, "chat_template_kwargs": {"enable_thinking": False}}, True)
    assert off.rstrip().endswith("</think>")
    assert reasoning_of(parser_name, off, "The answer is 4.") == ("", "The answer is 4.")
    opened = render(r1, ASK, True)  # R1's prompt opens the block: the output starts inside it
    assert opened.rstrip().endswith("<think>")
    assert reasoning_of(parser_name, opened, "add two and two\n</think>\n\n4") == ("add two and two", "4")


def test_earlier_reasoning_is_dropped_from_the_history_by_the_templates():
    """What the server passes back in an assistant message is the content; the templates themselves strip any
    <think> block a client leaves in it (so sending reasoning back costs no context)."""
    for name in ("Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B"):
        text = render(template(name), {"messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>secret</think>Hello!"},
            {"role": "user", "content": "2+2?"}]}, True)
        assert "Hello!" in text and "secret" not in text, name
