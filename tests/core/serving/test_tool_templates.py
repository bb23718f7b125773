"""What a chat template sees of a tool-using conversation: the request's tools, an assistant's earlier tool calls
(arguments as an object, Hugging Face's convention) and the tool results, rendered by a template in the Hermes
layout that Qwen 2.5/3 use (written for this test: the models' own templates are not on this machine)."""

from __future__ import annotations

import json

from engine.core.loader.chat_template import render_chat_template
from engine.core.serving import tool_choice
from engine.core.serving.protocol import ChatCompletionRequest

HERMES_LAYOUT = """
{%- if tools %}<|im_start|>system
You may call these functions:
<tools>
{%- for tool in tools %}
{{ tool.function | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "assistant" and m.tool_calls %}<|im_start|>assistant
{%- for c in m.tool_calls %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == "tool" %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def render(body: dict) -> str:
    req = ChatCompletionRequest.model_validate({"model": "m", **body})
    tools = tool_choice.template_tools(req)
    return render_chat_template(HERMES_LAYOUT, [m.template_message() for m in req.messages], True, {},
                                **({"tools": tools} if tools else {}))


def test_tools_calls_and_results_reach_the_template():
    text = render({"tools": [TOOL], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'}]})
    assert json.loads(between(text, "<tools>", "</tools>")) == TOOL["function"]
    call = json.loads(between(text, "<tool_call>", "</tool_call>"))
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}  # the arguments an object, not a string
    assert json.loads(between(text, "<tool_response>", "</tool_response>")) == {"sky": "sunny"}
    assert text.endswith("<|im_start|>assistant\n")


def between(text: str, start: str, end: str) -> str:
    assert text.count(start) == 1 and text.count(end) == 1, text
    return text.split(start)[1].split(end)[0].strip()


def test_tool_choice_none_hides_the_tools():
    text = render({"tools": [TOOL], "tool_choice": "none", "messages": [{"role": "user", "content": "hi"}]})
    assert "<tools>" not in text and "get_weather" not in text
