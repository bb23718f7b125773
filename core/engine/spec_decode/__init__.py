"""Speculative decoding in the engine core: proposers (n-gram prompt lookup, a draft model), verification of all
draft tokens in one target forward over the paged KV cache, and rejection sampling that keeps the target
distribution exactly. ``LLM(speculative_config={...})`` turns it on (``build_speculator``)."""

from __future__ import annotations

import logging

from .config import SpeculativeConfig
from .speculator import Speculator

__all__ = ["SpeculativeConfig", "Speculator", "build_speculator"]
log = logging.getLogger("engine")


def build_speculator(config: dict | SpeculativeConfig, llm) -> Speculator:
    """A Speculator for ``llm`` (an engine.LLM whose scheduler and KV cache are built). For "draft_model" this
    loads the draft checkpoint onto the target's device, with its own KV cache of the target's block geometry.
    A config that names no k (neither ``num_speculative_tokens`` nor a table) takes the platform's measured table
    for its method where it has one (``Platform.speculative_tables``; for an LLM with Q8 activations the table of
    "<method>+q8" first: cheaper verify rows change the answer)."""
    k_keys = {"num_speculative_tokens", "num_speculative_tokens_per_batch_size"}
    if isinstance(config, dict) and not k_keys & set(config):
        tables, method = type(llm.platform).speculative_tables, config.get("method", "ngram")
        table = (getattr(llm, "activation_quant", "none") == "q8" and tables.get(f"{method}+q8")) or tables.get(method)
        if table:
            log.info("speculative decoding: the %s platform's measured table %s (engine tune-spec measures one for "
                     "this model and machine)", llm.platform.name, table)
            config = {**config, "num_speculative_tokens_per_batch_size": dict(table)}
    config = SpeculativeConfig.from_dict(config)
    draft = None
    if config.method == "draft_model":
        import torch

        from engine.core.loader import load_checkpoint
        from engine.core.models.decoder import DecoderModel

        from .draft_model import DraftModelProposer

        dtype = getattr(torch, config.dtype) if config.dtype else llm.model.dtype
        ckpt = load_checkpoint(config.model, dtype=dtype, dequantize=config.dequantize)
        if ckpt.config.vocab_size != llm.config.vocab_size:
            raise ValueError(f"the draft model {ckpt.source!r} has a vocabulary of {ckpt.config.vocab_size} tokens "
                             f"but the target has {llm.config.vocab_size}; the draft must share the target's "
                             "tokenizer")
        model = DecoderModel(ckpt.config, ckpt.weights, dtype, llm.model.device)
        bm = llm.block_manager
        draft = DraftModelProposer(model, bm.num_blocks, bm.block_size, llm.engine.sampler)
    return Speculator(config, llm.scheduler, draft)
