"""Tool-call parsers: a model's tool calls, written in its own format, as OpenAI ``tool_calls``; the text around
them stays ``content``. On a stream, text is passed on as soon as it cannot be part of a call, and each call as soon
as it is complete. A call that does not parse (bad JSON, no name) is given back as content, never dropped."""

from __future__ import annotations

import hashlib
import json
import string
import uuid
from dataclasses import dataclass, field

from .reasoning import held_prefix


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def call_from(obj, args_keys=("arguments", "parameters")) -> ToolCall:
    """A ToolCall from a decoded ``{"name": ..., "arguments": {...}}`` (ValueError if it is not one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError("a tool call is a JSON object with a string 'name'")
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("a tool call's arguments are a JSON object")
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def decode_all(text: str, separators: str = " \t\r\n;,") -> list:
    """Every JSON value in ``text``, one after another (separated by whitespace, ';' or ','); ValueError otherwise."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in separators:
            i += 1
        if i == len(text):
            return values
        value, i = decoder.raw_decode(text, i)
        values.append(value)


class ToolParser:
    """Per choice: ``feed(piece) -> (content, calls)``, ``finish() -> (content, calls)``.

    ``needs_special_tokens``: the format's markers are special tokens, which the detokenizer would otherwise drop
    (the server keeps special tokens in the text of requests this parser reads)."""

    needs_special_tokens = True

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        raise NotImplementedError

    def finish(self) -> tuple[str, list[ToolCall]]:
        raise NotImplementedError


class MarkedParser(ToolParser):
    """Calls that open with ``start`` and close with ``end`` (or run to the end of the output when ``end`` is None);
    ``parse(body)`` turns what lies between into calls."""

    start: str = ""
    end: str | None = None

    def __init__(self):
        self._pending = ""  # text that may be the start of a marker
        self._body: str | None = None  # inside a call: its text so far

    def parse(self, body: str) -> list[ToolCall]:
        raise NotImplementedError

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        text, self._pending = self._pending + piece, ""
        content, calls = "", []
        while text:
            if self._body is None:
                at = text.find(self.start)
                if at < 0:
                    keep = held_prefix(text, self.start)
                    content, self._pending = content + text[:len(text) - keep], text[len(text) - keep:]
                    break
                content, text, self._body = content + text[:at], text[at + len(self.start):], ""
            elif self.end is None:
                self._body += text
                break
            else:
                at = text.find(self.end)
                if at < 0:
                    keep = held_prefix(text, self.end)
                    self._body, self._pending = self._body + text[:len(text) - keep], text[len(text) - keep:]
                    break
                self._body += text[:at]
                text = text[at + len(self.end):]
                more, found = self._close(self.end)
                content, calls = content + more, calls + found
        return content, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self._body is None:
            rest, self._pending = self._pending, ""
            return rest, []
        self._body += self._pending
        self._pending = ""
        return self._close("")

    def _close(self, end: str) -> tuple[str, list[ToolCall]]:
        body, self._body = self._body, None
        try:
            return "", self.parse(body)
        except ValueError:  # not a call after all (json.JSONDecodeError is a ValueError): the text is content
            return self.start + body + end, []


class HermesParser(MarkedParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call (Qwen 2.5, Qwen3, Hermes)."""

    start, end = "<tool_call>", "</tool_call>"
    needs_special_tokens = False  # Qwen's <tool_call> is an added token that decoding keeps

    def parse(self, body: str) -> list[ToolCall]:
        return [call_from(v) for v in decode_all(body)]


_ALNUM = string.ascii_letters + string.digits


def mistral_call_id(raw: str) -> str:
    """A tool-call id as Mistral's chat templates require (9 letters and digits, else they refuse the messages):
    ``raw`` itself when it is one, else 9 characters derived from it, so a call and its result keep matching."""
    if len(raw) == 9 and raw.isascii() and raw.isalnum():
        return raw
    n = int.from_bytes(hashlib.sha256(raw.encode()).digest()[:8], "big")
    return "".join(_ALNUM[(n // 62**i) % 62] for i in range(9))


class MistralParser(MarkedParser):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral 7B v0.3, Mixtral) or, from the 2025 models
    on, ``[TOOL_CALLS]name[ARGS]{...}`` once per call. The calls run to the end of the output. Call ids are 9 letters
    and digits, and the server passes the ids of a conversation's earlier calls through ``template_call_id``."""

    start, end = "[TOOL_CALLS]", None
    template_call_id = staticmethod(mistral_call_id)

    def parse(self, body: str) -> list[ToolCall]:
        calls = []
        for part in body.split(self.start):
            if "[ARGS]" in part and not part.lstrip().startswith(("[", "{")):
                name, args = part.split("[ARGS]", 1)
                calls.append(call_from({"name": name.strip(), "arguments": json.loads(args)}))
                continue
            for value in decode_all(part):
                calls += [call_from(v) for v in (value if isinstance(value, list) else [value])]
        if not calls:
            raise ValueError("no tool call after [TOOL_CALLS]")
        for call in calls:
            call.id = mistral_call_id(call.id)
        return calls


class Llama3JsonParser(ToolParser):
    """Llama 3.1-3.3 with JSON tool calling: the whole answer is ``{"name": ..., "parameters": {...}}`` (calls
    separated by ';', optionally after ``<|python_tag|>``). An answer that starts otherwise is content."""

    tag = "<|python_tag|>"

    def __init__(self):
        self._text = ""
        self._mode = "start"  # start -> content | calls

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        if self._mode == "content":
            return piece, []
        self._text += piece
        if self._mode == "start":
            head = self._text.lstrip()
            if not head or (len(head) < len(self.tag) and self.tag.startswith(head)):
                return "", []
            if head.startswith(("{", self.tag)):
                self._mode = "calls"
            else:
                self._mode, text, self._text = "content", self._text, ""
                return text, []
        return "", []

    def finish(self) -> tuple[str, list[ToolCall]]:
        text, self._text = self._text, ""
        if self._mode != "calls":
            return text, []
        try:
            calls = [call_from(v) for v in decode_all(text.strip().removeprefix(self.tag))]
        except ValueError:
            return text, []
        return ("", calls) if calls else (text, [])
