"""A model's own sampling defaults (vLLM's ``generation_config="auto"``): what ``LLM.get_default_sampling_params()``,
``LLM.generate(prompts)`` without SamplingParams and ``engine generate`` without sampling options use.

* an HF directory: the sampling fields of its generation_config.json, where present;
* the built-in default model (SmolLM2-135M-Instruct, Q4_1): the values below, chosen by measurement;
* any other GGUF file: none (GGUF metadata carries no sampling defaults), so SamplingParams' own apply.
"""

from __future__ import annotations

import logging
import os

from .errors import ModelLoadError
from .hf_config import read_json

log = logging.getLogger("engine")

# generation_config.json keys that map one to one onto SamplingParams fields.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

# The built-in model at SamplingParams' defaults (temperature 0.2, top_p 0.9, the model card's) ends 5 of 48 chat
# answers in a loop ("la femme, la femme, ...": 8 prompts x 6 seeds, 256 tokens, AMD EPYC, 2026-12-01); with
# repetition_penalty 1.05 2 of 48, with 1.1 none, greedy included (benchmarks/sampling_loops.py measures it).
BUILTIN_MODEL_DEFAULTS = {"repetition_penalty": 1.1}


def generation_defaults(path: str, is_dir: bool, builtin_path: str | None) -> dict:
    """The sampling overrides of the model at ``path`` (a dict of SamplingParams field -> value, possibly empty).
    ``builtin_path``: where the built-in default model lives (None when its package is not installed)."""
    if is_dir:
        return _hf_generation_defaults(path)
    if builtin_path is not None and os.path.realpath(path) == os.path.realpath(builtin_path):
        return dict(BUILTIN_MODEL_DEFAULTS)
    return {}


def _hf_generation_defaults(model_dir: str) -> dict:
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    cfg = read_json(path)
    out = {}
    for key in SAMPLING_KEYS:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadError(f"{path}: {key} must be a number, got {value!r}; fix or remove it")
        out[key] = int(value) if key == "top_k" else float(value)
    if cfg.get("do_sample") is False and out.get("temperature", 1.0) != 0:
        # HF's generate() ignores temperature/top_p/top_k when do_sample is false: the model's default is greedy.
        out["temperature"] = 0.0
    if out:
        from engine.core.engine.sampling_params import SamplingParams

        try:
            SamplingParams(**out)
        except ValueError as e:
            raise ModelLoadError(f"{path} holds sampling defaults SamplingParams refuses ({e}); fix or remove "
                                 "them") from e
        log.info("default sampling parameters from %s: %s (SamplingParams given to a call override them)", path, out)
    return out
