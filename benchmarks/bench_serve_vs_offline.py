"""Served vs offline throughput: ``engine serve`` under a load generator at 1, 32 and 64 concurrent streams against
``LLM.generate`` of the same shapes (prompt and output token counts, concurrency) in this process, per server
configuration (``--loop`` / ``--http`` variants, ``--data-parallel-size``), each level's offline run right before
its served one so both see the same host.

The load generator is guidellm (vLLM's project; ``pip install guidellm`` in its own venv and pass ``--guidellm
PATH``, or have it on PATH) with synthetic prompts of ``--prompt-tokens`` tokens and ``--output-tokens`` outputs;
the model's tokenizer is exported for it. Without guidellm, bench_serve.py's asyncio client sends token-id prompts
of the same shapes (what CI runs, tiny).

    python benchmarks/bench_serve_vs_offline.py --guidellm /tmp/gl/bin/guidellm \
        --configs "--loop asyncio --http h11" "--loop uvloop --http httptools"
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import _cpu_name, _free_port, _wait_ready, level_in_processes, running_server  # noqa: E402

# Output tokens of each warm-up request: a CPU decode graph is captured on a batch size's second decode step, so a
# warm-up of 2 tokens (one decode step) left both sides' first captures inside the timed run.
WARM_TOKENS = 8


def offline(llm_kwargs: dict, prompts: list[list[int]], output_tokens: int, clients: int,
            warm: list[list[int]]) -> float:
    """Output tokens per second of LLM.generate on ``prompts`` with ``clients`` sequences at a time, after a
    warm-up on ``warm`` (other prompts: a warm-up on the measured ones would leave them in the prefix cache, and
    the measured run would skip their prefill). The engine is released before returning (on a GPU the served
    engine shares the device)."""
    from engine.core.engine.llm import LLM
    from engine.core.engine.sampling_params import SamplingParams

    llm = LLM(**llm_kwargs, max_num_seqs=clients)
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    llm.generate(warm, SamplingParams(temperature=0, max_tokens=WARM_TOKENS, ignore_eos=True))
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    rate = len(prompts) * output_tokens / (time.perf_counter() - t0)
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rate


def token_prompts(vocab: int, n: int, length: int, rng: random.Random) -> list[list[int]]:
    """Random ids above the low ones (where special tokens live)."""
    low = min(1000, vocab // 4)
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(n)]


def guidellm_level(exe: str, port: int, tokenizer_dir: str, clients: int, requests: int, prompt_tokens: int,
                   output_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        subprocess.run([exe, "run", "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},"
                        "request_format=/v1/completions", "--profile", f"kind=concurrent,streams={clients}",
                        "--constraint", f"kind=max_requests,count={requests}", "--data",
                        f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
                        "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir}", "--output",
                        f"kind=json,path={out}", "--disable-console"], check=True, capture_output=True, timeout=3600)
        with open(out) as f:
            m = json.load(f)["benchmarks"][0]["metrics"]
    return {"output_tok_per_s": m["output_tokens_per_second"]["successful"]["mean"],
            "ttft_p50_ms": m["time_to_first_token_ms"]["successful"]["median"],
            "itl_p50_ms": m["inter_token_latency_ms"]["successful"]["median"],
            "requests": m["request_totals"]["successful"]}


def builtin_level(port: int, name: str, prompts: list[list[int]], clients: int, output_tokens: int,
                  procs: int = 1) -> dict:
    r = level_in_processes(port, name, prompts, output_tokens, clients, {"ignore_eos": True}, procs)
    return {"output_tok_per_s": r["output_tok_per_s"], "ttft_p50_ms": r["ttft_p50_ms"], "itl_p50_ms": r["itl_p50_ms"],
            "requests": len(prompts)}


def export_tokenizer(model: str | None) -> str:
    """The model's tokenizer as an HF tokenizer directory (guidellm counts tokens with transformers); an HF
    directory's own tokenizer.json is copied (loading an 8B checkpoint for it would take minutes)."""
    d = tempfile.mkdtemp(prefix="engine-tok-")
    if model is not None and os.path.isfile(os.path.join(model, "tokenizer.json")):
        shutil.copy(os.path.join(model, "tokenizer.json"), d)
    else:
        from engine.core.loader.checkpoint import load_checkpoint

        load_checkpoint(model).tokenizer.raw.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20}, f)
    return d


@contextlib.contextmanager
def random_model(shape: str | None, dtype: str):
    """bench_gpu's random-weight Llama (``shape`` "tiny" or "8b"; written on the GPU when there is one), or None."""
    if shape is None:
        yield None
        return
    from bench_gpu import random_llama

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with random_llama(shape == "tiny", getattr(torch, dtype), device) as (path, _):
        yield str(path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+", default=[""], help="`engine serve` option strings, one server each")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32, 64])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=0, help="per level (default: 2 per client, at least 8)")
    ap.add_argument("--guidellm", default=shutil.which("guidellm"), help="the guidellm executable")
    ap.add_argument("--client-procs", type=int, default=1,
                    help="built-in load generator: spread the clients over this many processes")
    ap.add_argument("--model")
    ap.add_argument("--random-llama", choices=("tiny", "8b"),
                    help="serve a random-weight Llama of this shape (written on the GPU when there is one)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="GPUs: the server's share of device memory; the offline engine, which runs beside it, "
                         "takes up to 0.9 of the total in all (default: CPU sizing, a 1 GiB KV cache each)")
    args = ap.parse_args(argv)
    with random_model(args.random_llama, args.dtype) as path:
        return measure(args, path or args.model)


def vocab_size(model: str | None) -> int:
    """The model's vocabulary size; an HF directory's from its config.json (loading an 8B checkpoint to learn it
    would take longer than the benchmark)."""
    if model is not None and os.path.isdir(model):
        with open(os.path.join(model, "config.json")) as f:
            return json.load(f)["vocab_size"]
    from engine.core.loader.checkpoint import load_checkpoint

    return load_checkpoint(model).config.vocab_size


def measure(args, model: str | None) -> dict:
    vocab = vocab_size(model)
    tok_dir = export_tokenizer(model) if args.guidellm else None
    rng = random.Random(0)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"), "cpu": _cpu_name(),
              "cores": len(os.sched_getaffinity(0)), "load_generator": "guidellm" if args.guidellm else "builtin",
              "client_procs": args.client_procs, "prompt_tokens": args.prompt_tokens,
              "output_tokens": args.output_tokens, "model": args.random_llama or model or "built-in",
              "dtype": args.dtype, "load_average_start": os.getloadavg()}
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name()
    server_args = ["--dtype", args.dtype]
    llm_kwargs = {"model": model, "dtype": args.dtype}
    if args.gpu_memory_utilization is None:
        llm_kwargs["kv_cache_bytes"] = 1 << 30
    else:
        server_args += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        llm_kwargs["gpu_memory_utilization"] = 0.9
    for config in args.configs:
        port = _free_port()
        with running_server([sys.executable, "-m", "engine.core.cli", "serve", "--port", str(port), "--log-level",
                             "warning", *(["--model", model] if model else []), *server_args,
                             *config.split()]) as proc:
            name = _wait_ready(f"http://127.0.0.1:{port}", proc)
            levels = {}
            for clients in args.clients:
                n = args.requests or max(8, 2 * clients)
                prompts = token_prompts(vocab, n, args.prompt_tokens, rng)
                # Both sides warm up on the same other prompts: the server, like the offline engine, has then run
                # this level's batch shapes once before it is timed.
                warm = token_prompts(vocab, clients, args.prompt_tokens, rng)
                base = offline(llm_kwargs, prompts, args.output_tokens, clients, warm)
                builtin_level(port, name, warm, clients, WARM_TOKENS, args.client_procs)
                served = (guidellm_level(args.guidellm, port, tok_dir, clients, n, args.prompt_tokens,
                                         args.output_tokens) if args.guidellm else
                          builtin_level(port, name, prompts, clients, args.output_tokens, args.client_procs))
                levels[str(clients)] = {"offline_tok_per_s": base, **served,
                                        "served_vs_offline": served["output_tok_per_s"] / base}
                print(config or "(defaults)", clients, json.dumps(levels[str(clients)]), file=sys.stderr, flush=True)
            result[config or "(defaults)"] = levels
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
