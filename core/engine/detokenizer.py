"""Streaming detokenization: the text each new token adds, without splitting multi-byte characters.

Decoding token by token is wrong twice over: a byte-level BPE token can end in the middle of a UTF-8
character (its lone bytes decode to U+FFFD), and some tokenizers render a token differently depending on
the token before it (leading spaces). So each step decodes a short window twice, once up to the last
emitted token (``read_offset``) and once including the new tokens, both starting a few tokens earlier
(``prefix_offset``) for context, and emits the difference; while the window ends in U+FFFD the bytes of a
character are still incomplete and nothing is emitted.

Where the tokenizer is a ``tokenizers.Tokenizer`` (or wraps one as ``.raw``) and the library has ``DecodeStream``
(with the prompt context as its first ids: tokenizers >= 0.22), the same algorithm runs there, in one call per token
instead of two decodes from Python: a decode step's host work grows with the batch, and on a GPU it is what a small
model waits for. Both paths give the same text (tests/core/engine/test_detokenizer.py runs every case on each).
"""

from __future__ import annotations

from typing import Protocol

import tokenizers


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


_CONTEXT_TOKENS = 5  # prompt tokens decoded along with the first outputs, for context


class IncrementalDetokenizer:
    """Turns a sequence's generated token ids into text, one delta per ``add``; ``text`` is all emitted text."""

    def __init__(self, tokenizer: Decoder, prompt_ids: list[int], skip_special_tokens: bool = True,
                 stream: bool = True):
        """``stream``: decode through ``tokenizers``' DecodeStream where it can (False: always the window)."""
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_ids)[max(0, len(prompt_ids) - _CONTEXT_TOKENS):]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""
        raw = tokenizer if isinstance(tokenizer, tokenizers.Tokenizer) else getattr(tokenizer, "raw", None)
        self._stream = None
        # A context that ends inside a character (a prompt given as token ids may) makes DecodeStream's first step
        # return the context's text too: such a sequence keeps the window (one decode here decides).
        if stream and DecodeStream is not None and isinstance(raw, tokenizers.Tokenizer) and (
                not self._decode(self._ids).endswith("\ufffd")):
            self._raw, self._vocab = raw, raw.get_vocab_size(with_added_tokens=True)
            self._stream = DecodeStream(ids=self._ids, skip_special_tokens=skip_special_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text it completes ("" while a character is incomplete)."""
        token_id = int(token_id)
        self._ids.append(token_id)
        if self._stream is not None:
            if not 0 <= token_id < self._vocab:
                raise ValueError(f"token ids [{token_id}] are outside the vocabulary (0..{self._vocab - 1})")
            delta = self._stream.step(self._raw, token_id)
            if not delta:
                return ""
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self.text += delta
            return delta
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


def _decode_stream():
    """tokenizers' DecodeStream if it takes a context to start from (``ids``, tokenizers >= 0.22), else None."""
    try:
        from tokenizers.decoders import DecodeStream

        DecodeStream(ids=[], skip_special_tokens=True)
    except (ImportError, TypeError):
        return None
    return DecodeStream


DecodeStream = _decode_stream()
