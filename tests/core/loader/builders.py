"""Test helpers: tiny tokenizers, tiny HF models saved as safetensors, and tiny GGUF files written with the
``gguf`` package the way llama.cpp's converter writes them (names from gguf's own TensorNameMap, llama q/k rows
permuted with convert_hf_to_gguf's permute)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from engine.core.ops.gguf_kquants import K_QTYPES, random_k_blocks

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.",
    "def add(a, b):\n    return a + b\n\nprint(add(12, 345))\n",
    "Numbers like 2024, 3.14159 and 1,000,000 appear in text. Café, naïve, Ελληνικά, 日本語.",
    "    indented line\n\tTabbed\tline  with   spaces\n\n\nand blank lines",
    "I'm sure they'll say we've done it; you're right, it's fine.",
]
VARIED_TEXTS = [
    "Hello, world!", "the lazy dog jumps", "naïve café ΔΣ 日本語 🙂👍🏽", "def f(x):\n    return x ** 2  # square\n",
    "3.14159 and 1,000,000 and 42nd", "a  b   c\t\td\n\n\ne", "   leading and trailing   ", "I'm you're they'll",
    "<|im_start|>user\nhi<|im_end|>\n", "\u00a0nbsp\u2003em-space", "", " ", "x=1;y=22;z=333",
]


def train_byte_level_bpe(vocab_size: int = 420) -> Tokenizer:
    """A small byte-level BPE trained on CORPUS with the GPT-2 split (HF's ByteLevel pre-tokenizer)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def train_sentencepiece_bpe(vocab_size: int = 360) -> tuple[list[str], list[float]]:
    """A llama-style (sentencepiece BPE) vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces in merge order,
    scored so that earlier merges score higher (how sentencepiece files order them)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False))
    pieces = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores


def bpe_parts(tok: Tokenizer) -> tuple[list[str], list[str]]:
    """(tokens by id, merges as 'a b') of a trained BPE tokenizer."""
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: the rotary row order GGUF files store."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# K-quant types gguf-py dequantizes but cannot quantize -> the byte offsets of their fp16 scales within a block.
RANDOM_BLOCK_SCALES = {gguf.GGMLQuantizationType.Q2_K: (80, 82), gguf.GGMLQuantizationType.Q3_K: (108,),
                       gguf.GGMLQuantizationType.Q4_K: (0, 2), gguf.GGMLQuantizationType.Q5_K: (0, 2),
                       gguf.GGMLQuantizationType.Q6_K: (208,)}


def random_blocks(shape: tuple[int, int], q, seed: int = 0) -> np.ndarray:
    """Valid blocks of a type in RANDOM_BLOCK_SCALES for a ``shape`` (rows, cols) matrix: random bits with small
    finite fp16 scales. Their values follow no given matrix (read them back with gguf.quants.dequantize)."""
    block, size = gguf.GGML_QUANT_SIZES[q]
    rows, cols = shape
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in RANDOM_BLOCK_SCALES[q]:
        raw[..., at:at + 2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def write_gguf(path: Path, arch: str, state_dict: dict[str, torch.Tensor], cfg, *, qtype=None,
               tokenizer: dict, rope_scaling: dict | None = None, extra=None) -> Path:
    """Write ``state_dict`` (HF names, an HF config ``cfg``) as a GGUF of ``arch``. ``qtype(name, array)`` picks each
    2-D tensor's GGML type (default F32; Q4_K / Q5_K / Q6_K get random super-blocks of the tensor's spread and
    another type in RANDOM_BLOCK_SCALES random_blocks, not the tensor's values). ``tokenizer`` holds the
    tokenizer.* metadata to write; ``extra(writer)``, if given, adds more metadata and tensors before the header
    is written."""
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim != cfg.hidden_size // cfg.num_attention_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    if rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling["rope_type"]))
        w.add_rope_scaling_factor(rope_scaling["factor"])
    w.add_tokenizer_model(tokenizer["model"])
    if "pre" in tokenizer:
        w.add_tokenizer_pre(tokenizer["pre"])
    w.add_token_list(tokenizer["tokens"])
    w.add_token_types(tokenizer["types"])
    if "merges" in tokenizer:
        w.add_token_merges(tokenizer["merges"])
    if "scores" in tokenizer:
        w.add_token_scores(tokenizer["scores"])
    w.add_bos_token_id(tokenizer["bos"])
    w.add_eos_token_id(tokenizer["eos"])
    w.add_add_bos_token(tokenizer.get("add_bos", False))
    if tokenizer.get("chat_template"):
        w.add_chat_template(tokenizer["chat_template"])
    for hf_name, t in state_dict.items():
        a = t.detach().float().numpy()
        if arch == "llama" and ".self_attn.q_proj." in hf_name:
            a = llama_permute(a, cfg.num_attention_heads)
        elif arch == "llama" and ".self_attn.k_proj." in hf_name:
            a = llama_permute(a, cfg.num_key_value_heads)
        q = qtype(hf_name, a) if qtype and a.ndim == 2 else gguf.GGMLQuantizationType.F32
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if q == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif q == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        elif q in K_QTYPES:  # kept quantized by the engine: random super-blocks of about the tensor's spread
            gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
            raw = random_k_blocks(a.shape[0], a.shape[1], int(q), gen, scale=float(a.std()))
            w.add_tensor(name, raw.numpy(), raw_dtype=q)
        elif q in RANDOM_BLOCK_SCALES:
            w.add_tensor(name, random_blocks(a.shape, q), raw_dtype=q)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, q), raw_dtype=q)
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def byte_level_gguf_tokenizer(pre: str, chat_template: str | None = CHATML) -> dict:
    """tokenizer.* metadata for a freshly trained byte-level BPE (specials are control tokens)."""
    tokens, merges = bpe_parts(train_byte_level_bpe())
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "types": types, "merges": merges,
            "bos": tokens.index("<|im_start|>"), "eos": tokens.index("<|im_end|>"), "chat_template": chat_template}


def save_hf_tokenizer(model_dir: Path, chat_template: str | None = CHATML, bos_in_template: bool = False) -> None:
    """tokenizer.json + tokenizer_config.json (+ chat template) for a trained byte-level BPE, as HF repos ship."""
    tok = train_byte_level_bpe()
    bos, eos = "<|im_start|>", "<|im_end|>"
    if bos_in_template:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(model_dir / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
           "unk_token": None, "pad_token": "<|endoftext|>", "model_max_length": 2048}
    if chat_template:
        cfg["chat_template"] = chat_template
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
