"""HF model directories: config.json + *.safetensors + tokenizer.json."""

from __future__ import annotations

import torch

from .hf_config import hf_config
from .hf_tokenizer import hf_tokenizer
from .safetensors_weights import load_safetensors, safetensors_files


def load_hf(model_dir: str, dtype: torch.dtype):
    """(config, weights, tokenizer) of the HF model in ``model_dir``. Weight names stay as the checkpoint
    writes them; a tied checkpoint's stored lm_head.weight and old rotary inv_freq buffers are dropped."""
    config = hf_config(model_dir)
    files = safetensors_files(model_dir)
    tokenizer = hf_tokenizer(model_dir, config.eos_token_ids)
    weights = load_safetensors(files, dtype)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    for name in [n for n in weights if n.endswith("rotary_emb.inv_freq")]:
        del weights[name]
    return config, weights, tokenizer
