"""``engine bench``: a synthetic offline workload; throughput, latency percentiles, KV waste and the kernels used.

Every request is a prompt of random token ids (from ``--seed``) decoded greedily with ``ignore_eos``, so each
produces exactly ``--output-len`` tokens. All requests arrive together at the start; time to first token
therefore includes queueing. A tiny warm-up request runs first (``--no-warmup`` skips it) and is not counted.
"""

from __future__ import annotations

import json
import os
import sys
import time

from engine.core.cli_generate import add_model_arguments, load_llm


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--max-num-seqs", type=int, default=None, help="scheduler cap on running sequences")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="scheduler token budget per step")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up request")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway off a terminal)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


class ProgressBar:
    """A one-line bar on stderr, redrawn at most every 0.1 s; a no-op when disabled."""

    def __init__(self, total: int, enabled: bool, width: int = 30):
        self.total, self.enabled, self.width = max(total, 1), enabled, width
        self.done, self.start, self._last = 0, time.perf_counter(), 0.0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last >= 0.1 or self.done >= self.total):
            self._last = now
            filled = self.width * min(self.done, self.total) // self.total
            elapsed = now - self.start
            rate = self.done / elapsed if elapsed > 0 else 0.0
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} tokens "
                             f"{elapsed:6.1f} s {rate:7.1f} tok/s")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def random_prompts(num: int, length: int | list[int], vocab_size: int, seed: int) -> list[list[int]]:
    """``num`` prompts of uniformly random token ids; ``length`` is one length or one per prompt."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = [length] * num if isinstance(length, int) else list(length)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


class KernelChoiceLog(dict):
    """Stands in for a KernelRegistry's choice cache (``_cache``: (op name, *arg keys) -> Impl) and remembers every
    (op, implementation) chosen, even after the registry clears the cache. Only cache misses reach
    ``__setitem__``, so the dispatch hot path pays nothing."""

    def __init__(self, existing: dict):
        super().__init__(existing)
        self.seen = {(key[0], impl.qualname) for key, impl in existing.items()}

    def __setitem__(self, key, impl) -> None:
        self.seen.add((key[0], impl.qualname))
        super().__setitem__(key, impl)

    @classmethod
    def install(cls, registry) -> KernelChoiceLog:
        log = cls(getattr(registry, "_cache", {}))
        registry._cache = log
        return log

    def by_op(self) -> dict[str, list[str]]:
        """Per op, the implementations dispatch chose on the real call shapes."""
        used: dict[str, set[str]] = {}
        for op, name in self.seen:
            used.setdefault(op, set()).add(name)
        return {op: sorted(names) for op, names in sorted(used.items())}


def run_workload(llm, prompts: list[list[int]], output_lens: list[int], progress: bool = False,
                 keep_tokens: bool = False) -> dict:
    """Run the prompts together, greedy with ignore_eos, each to its output length; return the measurements
    (with ``keep_tokens``, also each request's generated token ids, in prompt order, as "output_token_ids")."""
    from engine.core.engine.sampling_params import SamplingParams

    engine = llm.engine
    if engine.has_unfinished():
        raise RuntimeError("run_workload needs an idle engine; finish the running requests first")
    engine.stats.reset()
    preemptions = engine.num_preemptions
    bar = ProgressBar(sum(output_lens), progress)
    produced: dict[str, list[int]] = {}
    start = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
           for p, n in zip(prompts, output_lens, strict=True)]
    while engine.has_unfinished():
        for u in engine.step():
            bar.advance(len(u.new_token_ids))
            if u.finished:
                produced[u.request_id] = u.output.outputs[0].token_ids
    wall = time.perf_counter() - start
    bar.close()
    prompt_tokens, output_tokens = sum(len(p) for p in prompts), sum(len(t) for t in produced.values())
    result = {
        "num_requests": len(prompts),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "wall_time_s": wall,
        "end_to_end_tok_per_s": (prompt_tokens + output_tokens) / wall,
        "output_tok_per_s": output_tokens / wall,
        "num_preemptions": engine.num_preemptions - preemptions,
        **engine.stats.summary(),
    }
    if keep_tokens:
        result["output_token_ids"] = [produced[i] for i in ids]
    return result


def _check_args(args) -> None:
    for name in ("num_prompts", "input_len", "output_len", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def run(args) -> int:
    from engine.core.ops.registry import active_registry

    _check_args(args)
    kwargs = {k: getattr(args, k) for k in ("max_num_seqs", "max_num_batched_tokens") if getattr(args, k)}
    llm = load_llm(args, **kwargs)
    kernels = KernelChoiceLog.install(active_registry())
    if args.input_len + args.output_len > llm.max_model_len:
        raise ValueError(f"--input-len {args.input_len} + --output-len {args.output_len} exceeds the context of "
                         f"{llm.max_model_len} tokens; shorten them")
    vocab = llm.config.vocab_size
    if not args.no_warmup:  # its own random prompt (seed offset), so it leaves no prefix-cache hit behind
        run_workload(llm, random_prompts(1, min(args.input_len, 16), vocab, args.seed + 1_000_003), [2])
    prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed)
    progress = not args.no_progress and not args.json and sys.stderr.isatty()
    result = run_workload(llm, prompts, [args.output_len] * args.num_prompts, progress)
    sched = llm.scheduler
    report = {
        "model": str(llm.checkpoint_source), "platform": llm.platform.name,
        "device": llm.platform.device_name(), "dtype": args.dtype, "activation_quant": llm.activation_quant,
        "torch_threads": _threads(),
        "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
        "seed": args.seed, "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens, **result,
        "kernels": kernels.by_op(),
        "platform_facts": {k: str(v) for k, v in llm.platform.facts().items() if k.startswith("native")},
    }
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _pcts(d: dict, scale: float) -> str:
    return "  ".join(f"{k} {'-' if v is None else f'{v * scale:9.2f}'}" for k, v in d.items())


def format_text(r: dict) -> str:
    kernels = "\n".join(f"  {op:<26} {', '.join(names)}" for op, names in r["kernels"].items())
    return "\n".join([
        f"engine bench: {r['num_prompts']} prompts x {r['input_len']} in x {r['output_len']} out, "
        f"{os.path.basename(r['model'])}, {r['dtype']}, activation quant {r['activation_quant']}",
        f"platform       {r['platform']} ({r['device']}), {r['torch_threads']} torch threads",
        f"scheduler      max_num_seqs {r['max_num_seqs']}, max_num_batched_tokens {r['max_num_batched_tokens']}",
        f"wall time      {r['wall_time_s']:.2f} s, {r['num_steps']} steps, {r['num_preemptions']} preemptions",
        f"tokens         {r['prompt_tokens']} prompt, {r['output_tokens']} output "
        f"({r['prefill_tokens']} computed in prefill, {r['decode_tokens']} in decode)",
        f"prefill        {r['prefill_tok_per_s']:10.1f} tok/s  (prompt tokens / time of steps that prefilled)",
        f"decode         {r['decode_tok_per_s']:10.1f} tok/s  (tokens of decode-only steps / their time)",
        f"end-to-end     {r['end_to_end_tok_per_s']:10.1f} tok/s  (prompt + output over wall time)",
        f"output         {r['output_tok_per_s']:10.1f} tok/s",
        f"TTFT (ms)      {_pcts(r['ttft_s'], 1e3)}",
        f"TPOT (ms)      {_pcts(r['tpot_s'], 1e3)}",
        f"latency (s)    {_pcts(r['latency_s'], 1.0)}",
        f"KV cache waste {100 * r['kv_waste_mean']:.1f}% time-averaged, {100 * r['kv_waste_max']:.1f}% worst "
        "(allocated slots holding no token)",
        *(f"{k:<16} {v}" for k, v in r["platform_facts"].items()),
        "kernels in use:",
        kernels,
    ])
