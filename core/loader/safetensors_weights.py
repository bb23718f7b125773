"""Reading *.safetensors weights (one file or sharded with an index) from an HF model directory."""

from __future__ import annotations

import glob
import os

import torch

from .errors import ModelLoadError
from .hf_config import read_json

_PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.bin")


def safetensors_files(model_dir: str) -> list[str]:
    """The weight files, from model.safetensors.index.json when present; ModelLoadError when there are none."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no weight_map; restore it from the model's source")
        files = [os.path.join(model_dir, f) for f in sorted(set(weight_map.values()))]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise ModelLoadError(f"{model_dir} lacks the shard(s) {', '.join(map(os.path.basename, missing))} "
                                 "named in model.safetensors.index.json; download them")
        return files
    files = sorted(glob.glob(os.path.join(model_dir, "model*.safetensors"))) or \
        sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if files:
        return files
    pickles = sorted({os.path.basename(p) for pat in _PICKLE_PATTERNS for p in glob.glob(os.path.join(model_dir, pat))})
    if pickles:
        raise ModelLoadError(
            f"{model_dir} holds only pickle checkpoints ({', '.join(pickles)}); they can run arbitrary code when "
            "loaded, so they are refused. If you trust the file, convert it to safetensors once with: python -c "
            "\"from transformers import AutoModelForCausalLM as M; "
            f"M.from_pretrained('{model_dir}').save_pretrained('{model_dir}', safe_serialization=True)\"")
    raise ModelLoadError(f"{model_dir} has no *.safetensors weights; download the model's safetensors files")


def load_safetensors(files: list[str], dtype: torch.dtype, keep=None, skip=None) -> dict[str, torch.Tensor]:
    """Every tensor in ``files`` but those whose name ``skip(name)`` is true, floating ones cast to ``dtype`` unless
    ``keep(name, tensor)`` (a quantized checkpoint's FP8 values and scales); ModelLoadError for truncated/corrupt
    files."""
    from safetensors import SafetensorError, safe_open

    out: dict[str, torch.Tensor] = {}
    for path in files:
        size = os.path.getsize(path)
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    if skip is not None and skip(name):
                        continue
                    t = f.get_tensor(name)
                    cast = t.is_floating_point() and not (keep is not None and keep(name, t))
                    out[name] = t.to(dtype) if cast else t
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise ModelLoadError(f"{path} ({size} bytes) cannot be read as safetensors: {e}. The file is truncated "
                                 "or corrupted (an interrupted download?); download it again.") from e
    return out
