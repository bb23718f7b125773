"""A chat choice's output split into reasoning, content and tool calls, as it streams and as a whole.

``OutputParsing`` is what one request asks for (made by tool_choice.py from the request and the server's parser
options); ``ChoiceOutput`` applies it to one choice: ``feed(delta_text)`` with each piece of text and ``finish()``
at the end, each returning an OpenAI delta (``reasoning_content``, ``content``, ``tool_calls``), possibly empty."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .parsers import ToolCall
from .parsers.tool_calls import call_from


@dataclass
class OutputParsing:
    reasoning: object = None  # a reasoning-parser factory, or None
    tools: object = None  # a tool-parser factory (tool_choice auto), or None
    forced: str | None = None  # tool_choice "required", or the function named by tool_choice; the output is JSON
    prompt: str = ""  # the rendered chat prompt's end, shown to each reasoning parser

    @property
    def active(self) -> bool:
        return bool(self.reasoning or self.tools or self.forced)

    def choice(self) -> ChoiceOutput:
        return ChoiceOutput(self)


def forced_calls(text: str, forced: str) -> list[ToolCall]:
    """The calls of an output constrained by tool_choice: a named function's arguments object, or (required) an
    array of {"name", "parameters"}. The grammar makes it JSON; ValueError if it is cut off (max_tokens)."""
    value = json.loads(text)
    if forced == "required":
        return [call_from(v) for v in value]
    return [call_from({"name": forced, "arguments": value})]


class ChoiceOutput:
    def __init__(self, parsing: OutputParsing):
        self.forced = parsing.forced
        self.reasoning = parsing.reasoning() if parsing.reasoning else None
        if self.reasoning is not None:
            self.reasoning.seen_prompt(parsing.prompt)
        self.tools = parsing.tools() if parsing.tools else None
        self._forced_text = ""
        self.calls: list[ToolCall] = []

    def feed(self, piece: str) -> dict:
        reasoning, content = self.reasoning.feed(piece) if self.reasoning else ("", piece)
        return self._delta(reasoning, *self._content(content, final=False))

    def finish(self) -> dict:
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        text, calls = self._content(content, final=False)
        more, more_calls = self._content("", final=True)
        return self._delta(reasoning, text + more, calls + more_calls)

    def _content(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        if self.forced:
            self._forced_text += text
            if not final:
                return "", []
            try:
                return "", forced_calls(self._forced_text, self.forced)
            except ValueError:  # cut off before the JSON closed: the client gets the text, finish_reason length
                return self._forced_text, []
        if self.tools is None:
            return text, []
        return self.tools.finish() if final else self.tools.feed(text)

    def _delta(self, reasoning: str, content: str, calls: list[ToolCall]) -> dict:
        delta = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [c.openai(len(self.calls) + j) for j, c in enumerate(calls)]
            self.calls += calls
        return delta

    def message(self, text: str) -> dict:
        """The whole output as a chat message (a non-streamed response)."""
        first, last = self.feed(text), self.finish()
        reasoning = first.get("reasoning_content", "") + last.get("reasoning_content", "")
        content = first.get("content", "") + last.get("content", "")
        msg = {"role": "assistant", "content": content}
        if self.calls:
            msg["content"] = content.strip() or None
            msg["tool_calls"] = [c.openai() for c in self.calls]
        if self.reasoning is not None:
            msg["reasoning_content"] = reasoning or None
        return msg
