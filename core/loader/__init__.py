"""Model loading: GGUF files and HF safetensors directories -> config, HF-named weights, tokenizer."""

from .checkpoint import Checkpoint, default_model_path, load_checkpoint
from .errors import ModelLoadError
from .tokenizer import Tokenizer

__all__ = ["Checkpoint", "ModelLoadError", "Tokenizer", "default_model_path", "load_checkpoint"]
