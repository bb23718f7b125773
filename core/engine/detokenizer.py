"""Streaming detokenization: the text each new token adds, without splitting multi-byte characters.

Decoding token by token is wrong twice over: a byte-level BPE token can end in the middle of a UTF-8
character (its lone bytes decode to U+FFFD), and some tokenizers render a token differently depending on
the token before it (leading spaces). So each step decodes a short window twice, once up to the last
emitted token (``read_offset``) and once including the new tokens, both starting a few tokens earlier
(``prefix_offset``) for context, and emits the difference; while the window ends in U+FFFD the bytes of a
character are still incomplete and nothing is emitted.
"""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


_CONTEXT_TOKENS = 5  # prompt tokens decoded along with the first outputs, for context


class IncrementalDetokenizer:
    """Turns a sequence's generated token ids into text, one delta per ``add``; ``text`` is all emitted text."""

    def __init__(self, tokenizer: Decoder, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_ids)[max(0, len(prompt_ids) - _CONTEXT_TOKENS):]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Emit whatever is still held back (at the end of generation), replacement characters included."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta
