"""Tokenizer: a ``tokenizers.Tokenizer`` plus the special-token facts and chat template a model ships with."""

from __future__ import annotations

from collections.abc import Iterable

import tokenizers

from .chat_template import render_chat_template


class Tokenizer:
    """Text <-> token ids for one model.

    ``raw`` is the underlying ``tokenizers.Tokenizer`` (its post-processor adds BOS/EOS when the model
    asks for them). ``eos_token_ids`` holds every id that ends generation: the EOS token and the
    end-of-turn tokens the model's metadata names. ``special_tokens`` maps bos_token / eos_token / ...
    to their text, as chat templates expect them.
    """

    def __init__(self, raw: tokenizers.Tokenizer, *, bos_token_id: int | None, eos_token_ids: Iterable[int],
                 chat_template: str | None = None, special_tokens: dict[str, str | None] | None = None):
        self.raw = raw
        self.bos_token_id = bos_token_id
        self.eos_token_ids: set[int] = set(eos_token_ids)
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.raw.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the added tokens marked special, plus BOS and EOS: what decode(skip_special_tokens=True) drops."""
        ids = {i for i, tok in self.raw.get_added_tokens_decoder().items() if tok.special}
        ids |= self.eos_token_ids
        if self.bos_token_id is not None:
            ids.add(self.bos_token_id)
        return sorted(ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token text inside it (e.g. "<|im_start|>") maps to its single id."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self.raw.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; with ``skip_special_tokens`` the special tokens are left out."""
        ids = [int(i) for i in ids]
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary (0..{n - 1})")
        return self.raw.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}, ...]) with the model's chat template.

        The result is text: encode it with ``add_special_tokens=False`` when the template writes BOS itself.
        ValueError when the model has no chat template.
        """
        if not self.chat_template:
            raise ValueError("this model has no chat template, so it cannot take chat messages; "
                             "use generate with a plain text prompt instead")
        return render_chat_template(self.chat_template, messages, add_generation_prompt, self.special_tokens,
                                    **kwargs)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
                f"eos_token_ids={sorted(self.eos_token_ids)}, chat_template={self.chat_template is not None})")
