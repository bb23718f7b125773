"""Random-weight Llama-architecture model directories (config.json, model.safetensors, tokenizer.json), for
checking a platform end to end and for benchmarks on machines the default model cannot reach.

The weights are scaled so that activations stay O(1) through the layers and the output distribution is peaked:
greedy decoding then has clear margins, so two correct implementations pick the same tokens instead of tipping
between near-equal logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

LLAMA_1B = dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                num_kv_heads=8)
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                num_kv_heads=8)


def write_random_llama(path, *, vocab_size: int = 512, hidden_size: int = 256, intermediate_size: int = 512,
                       num_layers: int = 4, num_heads: int = 8, num_kv_heads: int = 2, max_position: int = 4096,
                       dtype: torch.dtype = torch.float32, seed: int = 0, device="cpu",
                       rope_theta: float = 10000.0) -> Path:
    """Write a LlamaForCausalLM directory of random weights to ``path`` and return it.

    The tokenizer is a word-level one over ``w0 .. w{vocab_size-1}`` (prompts are easiest given as token ids)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    gen = torch.Generator(device=device).manual_seed(seed)
    head_dim = hidden_size // num_heads

    def normal(*shape, std):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(dtype).cpu()

    def norm_weight():
        return (1 + normal(hidden_size, std=0.1).float()).to(dtype)

    w = {"model.embed_tokens.weight": normal(vocab_size, hidden_size, std=1.0),
         "model.norm.weight": norm_weight(),
         "lm_head.weight": normal(vocab_size, hidden_size, std=4.0 / hidden_size ** 0.5)}
    h, i = hidden_size, intermediate_size
    for n in range(num_layers):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal(num_heads * head_dim, h, std=2.0 / h ** 0.5)
        w[p + "self_attn.k_proj.weight"] = normal(num_kv_heads * head_dim, h, std=2.0 / h ** 0.5)
        w[p + "self_attn.v_proj.weight"] = normal(num_kv_heads * head_dim, h, std=1.0 / h ** 0.5)
        w[p + "self_attn.o_proj.weight"] = normal(h, num_heads * head_dim, std=0.5 / h ** 0.5)
        w[p + "mlp.gate_proj.weight"] = normal(i, h, std=1.0 / h ** 0.5)
        w[p + "mlp.up_proj.weight"] = normal(i, h, std=1.0 / h ** 0.5)
        w[p + "mlp.down_proj.weight"] = normal(h, i, std=0.5 / i ** 0.5)
    save_file(w, str(path / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
              "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
              "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "head_dim": head_dim,
              "max_position_embeddings": max_position, "rms_norm_eps": 1e-5, "rope_theta": rope_theta,
              "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
              "torch_dtype": str(dtype).removeprefix("torch."), "attention_bias": False, "mlp_bias": False}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    write_word_tokenizer(path, vocab_size)
    return path


def write_word_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer.json over ``w0 .. w{vocab_size-1}`` in ``path``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
