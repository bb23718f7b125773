"""``engine serve`` vs llama-cpp-python's OpenAI server (``llama_cpp.server``) on the same GGUF, over loopback.

Each server runs alone in its own process (never both at once), on the built-in default model (SmolLM2-135M-Instruct
Q4_1) unless --model is given. Clients stream /v1/completions with greedy decoding and a fixed output length
(engine: ``ignore_eos``; llama.cpp, which has no such field: ``logit_bias`` -100 on the EOS token), at 1 client
(requests one after another) and at 32 concurrent clients. Per level: output tok/s over the whole level (wall
clock), TTFT (request sent -> first token chunk) and inter-token latency (gaps between token chunks) p50/p99.

llama_cpp.server runs one request at a time (``--interrupt_requests False`` makes a new request wait instead of
cutting off the one streaming). Server overhead: the same 32 prompts through the offline ``LLM.generate`` in
this process (before any server starts), against the engine server's 32-client output tok/s.

llama-cpp-python is a benchmark-only dependency: ``pip install 'llama-cpp-python[server]'`` (builds from source).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

import httpx

PROMPTS = [f"Write a short story about a {a} who finds a {b} in the {c}." for a, b, c in
           [(a, b, c) for a in ("cat", "knight", "robot", "child") for b in ("key", "map", "book", "door")
            for c in ("forest", "city")]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def _one(http, url, model, prompt, max_tokens, extra) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    t0 = time.perf_counter()
    times, tokens = [], 0
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
                tokens += 1
    return {"ttft": times[0] - t0 if times else None, "itl": [b - a for a, b in zip(times, times[1:], strict=False)],
            "chunks": tokens}


async def _level(url, model, prompts, max_tokens, clients, extra) -> dict:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        queue = list(prompts)
        results = []

        async def worker():
            while queue:
                results.append(await _one(http, url, model, queue.pop(0), max_tokens, extra))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    itl = [x for r in results for x in r["itl"]]
    out_tokens = len(prompts) * max_tokens
    return {"clients": clients, "requests": len(prompts), "output_tokens": out_tokens, "wall_s": wall,
            "output_tok_per_s": out_tokens / wall,
            "ttft_p50_ms": _pct(ttft, 50) * 1e3, "ttft_p99_ms": _pct(ttft, 99) * 1e3,
            "itl_p50_ms": _pct(itl, 50) * 1e3, "itl_p99_ms": _pct(itl, 99) * 1e3,
            "chunks_per_request": sum(r["chunks"] for r in results) / len(results)}


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            r = httpx.get(url + "/v1/models", timeout=2)
            if r.status_code == 200:
                return r.json()["data"][0]["id"]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become ready")


def _run_server(cmd: list[str], port: int, levels, prompts, max_tokens, extra, env=None) -> dict:
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()  # not a pipe: a server that logs a lot would block on a full one
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        model = _wait_ready(url, proc)
        asyncio.run(_level(url, model, prompts[:2], 4, 1, extra))  # warm-up
        return {str(c): asyncio.run(_level(url, model, prompts if c > 1 else prompts[:n1], max_tokens, c, extra))
                for c, n1 in levels}
    except RuntimeError:
        log.seek(0)
        print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _offline(model_path, prompts, max_tokens) -> dict:
    from engine.core.engine.llm import LLM
    from engine.core.engine.sampling_params import SamplingParams

    llm = LLM(model_path, max_num_seqs=64)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up at full batch
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(prompts), "output_tokens": n, "wall_s": wall, "output_tok_per_s": n / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="GGUF file (default: the built-in SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--single-requests", type=int, default=4, help="requests sent one after another at 1 client")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-llamacpp", action="store_true")
    args = ap.parse_args()
    from engine.core.loader.checkpoint import default_model_path

    model = args.model or default_model_path()
    levels = [(1, args.single_requests), (32, None)]
    env = {**os.environ, "ENGINE_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "cpu": _cpu_name(), "threads": args.threads, "model": os.path.basename(model),
              "max_tokens": args.max_tokens}
    os.environ["ENGINE_NUM_THREADS"] = str(args.threads)  # as the servers get it
    result["offline_llm"] = _offline(model, PROMPTS, args.max_tokens)
    print(json.dumps(result["offline_llm"]), file=sys.stderr, flush=True)
    port = _free_port()
    result["engine"] = _run_server([sys.executable, "-m", "engine.core.cli", "serve", "--model", model, "--port",
                                    str(port), "--log-level", "warning"], port, levels, PROMPTS, args.max_tokens,
                                   {"ignore_eos": True}, env)
    eng32 = result["engine"]["32"]["output_tok_per_s"]
    result["engine_server_overhead"] = 1 - eng32 / result["offline_llm"]["output_tok_per_s"]
    print(json.dumps(result["engine"]), file=sys.stderr, flush=True)
    if not args.skip_llamacpp:
        port = _free_port()
        result["llamacpp"] = _run_server(
            [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--n_ctx", "4096",
             "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
             "--interrupt_requests", "False"], port, levels, PROMPTS,
            args.max_tokens, {"logit_bias": {"2": -100}}, env)
        result["ratio_32_clients_tok_per_s"] = eng32 / result["llamacpp"]["32"]["output_tok_per_s"]
        ttfts = result["engine"]["1"]["ttft_p50_ms"], result["llamacpp"]["1"]["ttft_p50_ms"]
        result["ratio_1_client_ttft_p50"] = ttfts[0] / ttfts[1]
    print(json.dumps(result, indent=1))


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
        flags = next(line for line in out.splitlines() if line.startswith("Flags"))
        isa = [f for f in ("avx512f", "avx512_vnni", "amx_tile", "avx2") if f" {f}" in flags]
        return f"{name} ({', '.join(isa)})"
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
