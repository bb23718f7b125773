"""Output parsers of chat completions, chosen by name: reasoning parsers (``--reasoning-parser``) split a model's
thinking into ``reasoning_content``; tool-call parsers (``--tool-call-parser``) turn the tool calls a model writes in
its own format into OpenAI ``tool_calls``.

Both are plugins by name: the built-in ones register here, and a package adds its own through the entry-point groups
``engine.reasoning_parsers`` / ``engine.tool_parsers`` (``name = "module:ParserClass"``), the class taking no
arguments. Every parser works on a stream: ``feed(text)`` with each new piece of output and ``finish()`` at its end,
each returning what can be told apart so far; parsing a whole output is feeding it at once. A reasoning parser is
shown the end of the rendered prompt first (``seen_prompt``), since templates open or close the block there.
"""

from __future__ import annotations

import difflib
from importlib import metadata

from .reasoning import ReasoningParser, ThinkParser
from .tool_calls import HermesParser, Llama3JsonParser, MistralParser, ToolCall, ToolParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    # Both read the prompt's end (seen_prompt) and differ only where it neither opens nor closes a block:
    "deepseek_r1": ThinkParser.starting_inside,  # R1's template opens <think> in the prompt
    "qwen3": ThinkParser,  # Qwen3 writes <think> itself (its template closes an empty block when thinking is off)
}
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,  # <tool_call>{...}</tool_call>: Qwen 2.5 / Qwen3, Hermes 2/3
    "llama3_json": Llama3JsonParser,  # {"name": ..., "parameters": {...}}: Llama 3.1-3.3
    "mistral": MistralParser,  # [TOOL_CALLS][{...}] and [TOOL_CALLS]name[ARGS]{...}
}

__all__ = ["ReasoningParser", "ToolCall", "ToolParser", "reasoning_parser", "tool_parser"]


def _find(kind: str, group: str, table: dict, name: str):
    if name in table:
        return table[name]
    found = [ep for ep in metadata.entry_points(group=group) if ep.name == name]
    if found:
        try:
            return found[0].load()
        except Exception as exc:
            raise ValueError(f"the {kind} parser {name!r} ({found[0].value}) failed to import: "
                             f"{type(exc).__name__}: {exc}; reinstall the package that provides it") from exc
    known = sorted(set(table) | {ep.name for ep in metadata.entry_points(group=group)})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown {kind} parser {name!r}; known: {', '.join(known)}.{hint}")


def reasoning_parser(name: str):
    """The factory of the reasoning parser called ``name`` (ValueError naming the known ones if none is)."""
    return _find("reasoning", "engine.reasoning_parsers", REASONING_PARSERS, name)


def tool_parser(name: str):
    """The factory of the tool-call parser called ``name`` (ValueError naming the known ones if none is)."""
    return _find("tool-call", "engine.tool_parsers", TOOL_PARSERS, name)
