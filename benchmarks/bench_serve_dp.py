"""``engine serve --data-parallel-size N`` against N = 1 on the same machine: served output tokens per second at
1, 32 and 64 streaming clients, each server alone, in one run (the load generator is bench_serve.py's).

On a CPU, N engine processes split the cores (``Platform.data_parallel_slice``): N = 2 on 2 cores is two
single-threaded engines against one two-threaded engine. Greedy, ``ignore_eos``, a fixed output length, distinct
prompts per level.

    python benchmarks/bench_serve_dp.py                      # N = 2 vs 1, 64 tokens per request
    python benchmarks/bench_serve_dp.py --sizes 1 2 4 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import PROMPTS_ALL, _cpu_name, _free_port, _level, _wait_ready, running_server  # noqa: E402


def measure(size: int, levels: list[int], max_tokens: int, requests: int, model: str | None) -> dict:
    """Start a server with --data-parallel-size ``size``, warm it up, run each client level."""
    port = _free_port()
    cmd = [sys.executable, "-m", "engine.core.cli", "serve", "--port", str(port), "--log-level", "warning",
           "--data-parallel-size", str(size)] + (["--model", model] if model else [])
    with running_server(cmd) as proc:
        name = _wait_ready(f"http://127.0.0.1:{port}", proc)
        asyncio.run(_level(port, name, PROMPTS_ALL[:max(levels)], 4, max(levels), {"ignore_eos": True}))  # warm-up
        out = {}
        for i, clients in enumerate(levels):
            n = max(requests, clients)
            prompts = [f"{PROMPTS_ALL[(i * 61 + j) % len(PROMPTS_ALL)]} ({i}.{j})" for j in range(n)]
            out[str(clients)] = asyncio.run(_level(port, name, prompts, max_tokens, clients, {"ignore_eos": True}))
        return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2], help="data-parallel sizes (the first: baseline)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=64, help="requests per level (at least one per client)")
    ap.add_argument("--model", help="default: the built-in model")
    args = ap.parse_args(argv)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "cpu": _cpu_name(), "cores": len(os.sched_getaffinity(0)), "load_average_start": os.getloadavg(),
              "max_tokens": args.max_tokens}
    for size in args.sizes:
        result[f"dp{size}"] = measure(size, args.clients, args.max_tokens, args.requests, args.model)
    base = args.sizes[0]
    for size in args.sizes[1:]:
        result[f"ratio_dp{size}_vs_dp{base}"] = {
            str(c): result[f"dp{size}"][str(c)]["output_tok_per_s"] / result[f"dp{base}"][str(c)]["output_tok_per_s"]
            for c in args.clients}
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
