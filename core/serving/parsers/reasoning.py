"""Reasoning parsers: the text a model writes between ``<think>`` and ``</think>`` becomes ``reasoning_content``,
the rest ``content``, on a stream as on a whole output (a tag split across two pieces is held back, not leaked)."""

from __future__ import annotations


def held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (text that may turn out to be the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Per choice: ``seen_prompt(prompt)`` once with the rendered chat prompt, then ``feed(piece) -> (reasoning,
    content)`` and ``finish() -> (reasoning, content)``."""

    def seen_prompt(self, prompt: str) -> None:
        """The chat prompt the output continues (templates open or close the reasoning block in it); by default
        ignored."""

    def feed(self, piece: str) -> tuple[str, str]:
        raise NotImplementedError

    def finish(self) -> tuple[str, str]:
        raise NotImplementedError


class ThinkParser(ReasoningParser):
    """``<think>reasoning</think>content``. An output that does not open with ``<think>`` starts as reasoning when
    the prompt ends inside the block (DeepSeek-R1's template ends it with ``<think>``), as content when the prompt
    closed it (Qwen3 with ``enable_thinking`` off: ``<think></think>``), and otherwise as ``inside`` says. An output
    cut off inside the block is all reasoning."""

    start, end = "<think>", "</think>"

    def __init__(self, inside: bool = False):
        self._state = "start"  # start -> inside -> after; start -> after (or, with ``inside``, start -> inside)
        self._untagged = "inside" if inside else "after"  # where an output not opening with <think> goes
        self._pending = ""
        self._lead = False

    @classmethod
    def starting_inside(cls) -> ThinkParser:
        return cls(inside=True)

    def seen_prompt(self, prompt: str) -> None:
        tail = prompt.rstrip()
        if tail.endswith(self.start):
            self._untagged = "inside"
        elif tail.endswith(self.end):
            self._untagged = "after"

    def feed(self, piece: str) -> tuple[str, str]:
        text, self._pending = self._pending + piece, ""
        reasoning = content = ""
        if self._state == "start":
            stripped = text.lstrip()
            if not stripped or (len(stripped) < len(self.start) and self.start.startswith(stripped)):
                self._pending = text  # could still open with <think>
                return "", ""
            if stripped.startswith(self.start):
                self._state, text = "inside", stripped[len(self.start):]
            else:
                self._state = self._untagged
        if self._state == "inside":
            at = text.find(self.end)
            if at < 0:
                keep = held_prefix(text, self.end)
                self._pending = text[len(text) - keep:]
                return text[:len(text) - keep], ""
            reasoning, text = text[:at], text[at + len(self.end):]
            self._state, self._lead = "after", True
        if self._state == "after":
            if self._lead:  # the newlines between </think> and the answer belong to neither
                text = text.lstrip("\n")
                self._lead = not text
            content = text
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        rest, self._pending = self._pending, ""
        if self._state == "inside" or (self._state == "start" and self._untagged == "inside"):
            return rest, ""
        return "", rest
