"""The bytes each token id stands for: what a grammar library needs to know which tokens a grammar allows.

Decoding a lone token through the tokenizer is not enough: a byte-level BPE token may hold half a UTF-8
character, which decodes to U+FFFD. So the bytes are read from the vocabulary's own spelling: byte-level BPE
vocabularies spell each byte as one printable character (GPT-2's table), sentencepiece vocabularies write a
space as U+2581 and raw bytes as ``<0xAB>``. Special (added) tokens map to b"" (a grammar never emits them).
"""

from __future__ import annotations

import functools
import re

from engine.core.loader.gguf_tokenizer import bytes_to_unicode

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's byte -> printable character table (the loader's)."""
    return {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(tokenizer) -> list[bytes]:
    """``[bytes of token 0, bytes of token 1, ...]`` for an engine Tokenizer (its ``raw`` tokenizers.Tokenizer)."""
    raw = tokenizer.raw
    n = tokenizer.vocab_size
    special = set(tokenizer.all_special_ids)
    pieces = [raw.id_to_token(i) or "" for i in range(n)]
    table = _unicode_to_byte()
    regular = [p for i, p in enumerate(pieces) if i not in special]
    byte_level = all(c in table for p in regular[:2000] for c in p)
    out = []
    for i, p in enumerate(pieces):
        if i in special:
            out.append(b"")
        elif byte_level:
            out.append(bytes(table[c] for c in p) if all(c in table for c in p) else p.encode())
        else:
            m = _BYTE_TOKEN.match(p)
            out.append(bytes([int(m.group(1), 16)]) if m else p.replace("\u2581", " ").encode())
    return out
