"""The tokenizer of an HF model directory: tokenizer.json, tokenizer_config.json, chat template, stop tokens."""

from __future__ import annotations

import os

import tokenizers

from .errors import ModelLoadError
from .hf_config import as_id_list, read_json
from .tokenizer import Tokenizer

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or a serialized AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(model_dir: str, tok_cfg: dict) -> str | None:
    path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    path = os.path.join(model_dir, "chat_template.json")
    template = read_json(path).get("chat_template") if os.path.isfile(path) else tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template or None


def hf_tokenizer(model_dir: str, config_eos: list[int]) -> Tokenizer:
    """Tokenizer from ``model_dir``; EOS ids gather tokenizer_config's eos_token, config.json's and
    generation_config.json's eos_token_id (the latter lists every stop token of chat models)."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{model_dir} has no tokenizer.json. If it has only a sentencepiece tokenizer.model, "
                             "write tokenizer.json once with: python -c \"from transformers import AutoTokenizer; "
                             f"AutoTokenizer.from_pretrained('{model_dir}').save_pretrained('{model_dir}')\"")
    try:
        raw = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise ModelLoadError(f"{path} cannot be parsed ({e}); restore it from the model's source") from e
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    tok_cfg = read_json(cfg_path) if os.path.isfile(cfg_path) else {}
    specials = {name: _token_text(tok_cfg.get(name)) for name in _SPECIAL_NAMES}

    def token_id(name: str) -> int | None:
        text = specials[name]
        return raw.token_to_id(text) if text else None

    gen_path = os.path.join(model_dir, "generation_config.json")
    gen_eos = as_id_list(read_json(gen_path).get("eos_token_id")) if os.path.isfile(gen_path) else []
    n = raw.get_vocab_size(with_added_tokens=True)
    eos = {i for i in [token_id("eos_token"), *config_eos, *gen_eos] if i is not None and 0 <= i < n}
    return Tokenizer(raw, bos_token_id=token_id("bos_token"), eos_token_ids=eos,
                     chat_template=_chat_template(model_dir, tok_cfg), special_tokens=specials)
