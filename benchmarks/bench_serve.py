"""``engine serve`` vs llama-cpp-python's OpenAI server (``llama_cpp.server``) on the same GGUF, over loopback.

Each server runs alone in its own process (never both at once), on the built-in default model (SmolLM2-135M-Instruct
Q4_1) unless --model is given. Clients stream /v1/completions with greedy decoding and a fixed output length; both
servers get ``logit_bias`` -100 on the EOS token (so the first token is a visible one for both: unbiased, this
model's first greedy token here is EOS, which streams no text) and the engine also ``ignore_eos``. Levels, in order:

- ``1_repeated``: 1 client sends the same prompt again and again (after one warm-up request with it). A server with
  a prompt cache (llama_cpp.server keeps the KV of its previous request; the engine's prefix cache) recomputes
  little of it.
- ``1_fresh``: 1 client sends prompts of the same token length that no earlier request began with (each differs
  from every other in its first token), so no prompt cache can help: a first-time prompt's TTFT.
- ``32``: 32 concurrent clients, 32 distinct prompts; the engine's run is repeated (--reps, fresh prompts each
  time) and the median run reported.

Per level: output tok/s (wall clock), TTFT (request sent -> first chunk with text) and inter-token latency (gaps
between text chunks) p50/p99. llama_cpp.server runs one request at a time (``--interrupt_requests False`` makes a
new request wait instead of cutting off the one streaming).

Offline reference, with the same sampling, in this process while the engine server is up and idle, right before
each served level it is compared with (so that both see the same host): ``LLM.stream`` TTFT of the 1-client
levels' prompts (server path = served TTFT p50 - offline TTFT p50), and ``LLM.generate`` of each 32-client run's
prompts (server overhead = 1 - served tok/s / offline tok/s, per pair; the median pair reported).

The load generator is a small HTTP/1.1 client on asyncio streams (keep-alive, chunked SSE), not httpx: on a 2-core
host every cycle the client spends is taken from the server it measures, and httpx spent 4x this client's CPU per
chunk (twice the engine server's own). llama-cpp-python is a benchmark-only dependency:
``pip install 'llama-cpp-python[server]'`` (or --llamacpp-pythonpath where it is installed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

import httpx

_VERBS = ("Write", "Tell", "Give", "Make", "Draft", "Compose", "Invent", "Create")
PROMPTS_ALL = [f"{v} a short story about a {a} who finds a {b} in the {c}." for v in _VERBS
               for a in ("cat", "knight", "robot", "child") for b in ("key", "map", "book", "door")
               for c in ("forest", "city")]


def prompt_set(rep: int) -> list[str]:
    """The 32-client prompts of repetition ``rep``: 32 distinct prompts, none sharing a first token with another
    repetition's (so no run is served from an earlier one's cache)."""
    if rep >= len(_VERBS):
        raise ValueError(f"at most {len(_VERBS)} repetitions")
    return PROMPTS_ALL[32 * rep:32 * (rep + 1)]


WARMUP = [f"Tell me a tale of a {a} and a {b} by the {c}." for a in ("dog", "queen", "ghost", "pilot")
          for b in ("lamp", "ship", "coin", "bell") for c in ("sea", "lake")]
REPEATED = "Write a short story about a whale who finds a bell in the sea."  # in no other set
_NAMES = ("Anna Ben David Henry Jack Paul Sam Victor Alex Carl George Mark Peter Simon Clara Emma Grace Iris Kate Leo "
          "Mia Noah Olga Rosa Tina Bella Dora Eric Fiona Hannah Ivan Julia Karl Laura Nina Oscar Quinn Ruth").split()
_THINGS = ("a cat who finds a key in the forest", "a knight who finds a map in the city",
           "a robot who finds a book", "a child who finds a door", "an owl who finds a coin", "a fox in a boat")


def fresh_prompts(tokenizer, n: int, length: int, avoid: list[str]) -> list[str]:
    """``n`` prompts of ``length`` tokens whose first tokens differ from each other's and from ``avoid``'s."""
    seen = {tokenizer.encode(p)[0] for p in avoid}
    out = []
    for name in _NAMES:
        for thing in _THINGS:
            p = f"{name} wants a story about {thing}."
            ids = tokenizer.encode(p)
            if len(ids) == length and ids[0] not in seen:
                seen.add(ids[0])
                out.append(p)
                break
        if len(out) == n:
            return out
    raise RuntimeError(f"found only {len(out)} fresh prompts of {length} tokens; add names to _NAMES")


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


class _Client:
    """One keep-alive HTTP/1.1 connection streaming server-sent events."""

    def __init__(self, port: int):
        self.port, self.reader, self.writer = port, None, None

    async def _connect(self):
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    async def sse(self, path: str, body: dict):
        """Yield (arrival time, parsed JSON) per ``data: {...}`` event of a streamed POST."""
        await self._connect()
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                          f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        r = self.reader
        status = await r.readline()
        headers = {}
        while (line := await r.readline()) not in (b"\r\n", b"\n", b""):
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip().lower()
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{path}: {status.decode().strip()}")
        chunked = headers.get("transfer-encoding") == "chunked"
        buf = b""
        while True:
            if chunked:
                size = int((await r.readline()).split(b";")[0], 16)
                if size == 0:
                    await r.readline()
                    break
                piece = (await r.readexactly(size + 2))[:-2]
            else:  # no framing: the body runs to the end of the connection
                piece = await r.read(1 << 16)
                if not piece:
                    self.close()
                    break
            t = time.perf_counter()
            buf += piece.replace(b"\r\n", b"\n")
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                for line in ev.split(b"\n"):
                    if line.startswith(b"data: {"):
                        yield t, json.loads(line[6:])
        if headers.get("connection") == "close":
            self.close()


async def _one(client: _Client, model, prompt, max_tokens, extra) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    t0 = time.perf_counter()
    times = []
    async for t, chunk in client.sse("/v1/completions", body):
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            times.append(t)
    return {"ttft": times[0] - t0 if times else None, "itl": [b - a for a, b in zip(times, times[1:], strict=False)],
            "chunks": len(times)}


async def _run_clients(port, model, prompts, max_tokens, clients, extra) -> tuple[list[dict], float, float]:
    """``clients`` connections taking ``prompts`` from one queue: (per-request results, start, end) on
    ``time.perf_counter`` (the system-wide monotonic clock, so comparable between processes)."""
    queue = list(prompts)
    results = []

    async def worker():
        client = _Client(port)
        try:
            while queue:
                results.append(await _one(client, model, queue.pop(0), max_tokens, extra))
        finally:
            client.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return results, t0, time.perf_counter()


def _summary(results: list[dict], wall: float, clients: int, max_tokens: int) -> dict:
    ttft = [r["ttft"] for r in results if r["ttft"] is not None]
    itl = [x for r in results for x in r["itl"]]  # empty when every answer came in one chunk
    out_tokens = len(results) * max_tokens

    def ms(xs, q):
        v = _pct(xs, q)
        return None if v is None else v * 1e3

    return {"clients": clients, "requests": len(results), "output_tokens": out_tokens, "wall_s": wall,
            "output_tok_per_s": out_tokens / wall,
            "ttft_p50_ms": ms(ttft, 50), "ttft_p99_ms": ms(ttft, 99),
            "ttft_ms": [round(x * 1e3, 1) for x in ttft] if clients == 1 else None,
            "itl_p50_ms": ms(itl, 50), "itl_p99_ms": ms(itl, 99),
            "chunks_per_request": sum(r["chunks"] for r in results) / len(results)}


async def _level(port, model, prompts, max_tokens, clients, extra) -> dict:
    results, t0, t1 = await _run_clients(port, model, prompts, max_tokens, clients, extra)
    return _summary(results, t1 - t0, clients, max_tokens)


def _client_process(barrier, port, model, prompts, max_tokens, clients, extra):
    barrier.wait()
    return asyncio.run(_run_clients(port, model, prompts, max_tokens, clients, extra))


def level_in_processes(port, model, prompts, max_tokens, clients, extra, procs: int) -> dict:
    """``_level`` with its clients spread over ``procs`` client processes started together (one Python process
    parsing every stream caps what a fast server can show: a GPU at 64 streams sends over 10k chunks a second).
    Throughput is all requests' tokens over first start to last end."""
    if procs <= 1:
        return asyncio.run(_level(port, model, prompts, max_tokens, clients, extra))
    procs = min(procs, clients)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # the caller may hold a GPU context, which a fork must not copy
    shares = [prompts[i::procs] for i in range(procs)]
    counts = [clients // procs + (i < clients % procs) for i in range(procs)]
    with ctx.Manager() as manager, ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        barrier = manager.Barrier(procs)
        runs = list(pool.map(_client_process, [barrier] * procs, [port] * procs, [model] * procs, shares,
                             [max_tokens] * procs, counts, [extra] * procs))
    results = [r for rs, _, _ in runs for r in rs]
    return _summary(results, max(t1 for _, _, t1 in runs) - min(t0 for _, t0, _ in runs), clients, max_tokens)


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


@contextlib.contextmanager
def running_server(cmd: list[str], env=None):
    """The server process of ``cmd`` while the block runs (its log's tail printed if the block raises
    RuntimeError); terminated after."""
    log = tempfile.TemporaryFile()  # not a pipe: a server that logs a lot would block on a full one
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        yield proc
    except RuntimeError:
        log.seek(0)
        print(log.read().decode(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _run_server(cmd: list[str], port: int, max_tokens: int, extra: dict, fresh: list[str], reps: int, env,
                offline=None) -> dict:
    """Start the server, warm it up, run the levels; with ``offline`` (an in-process LLM and its params), measure
    the same work offline right before each served level, so that both see the same host."""
    url = f"http://127.0.0.1:{port}"
    with running_server(cmd, env) as proc:
        model = _wait_ready(url, proc)
        asyncio.run(_level(port, model, WARMUP[:2] + [REPEATED], 4, 1, extra))  # warm-up; the repeated one seen
        out = {"load_average_before": os.getloadavg()}
        for name, prompts in (("1_repeated", [REPEATED] * len(fresh)), ("1_fresh", fresh)):
            if offline:
                out[f"offline_{name}"] = _offline_ttft(*offline, prompts)
            out[name] = asyncio.run(_level(port, model, prompts, max_tokens, 1, extra))
        runs = []
        for r in range(reps):  # each repetition its own prompts: no cache hit on an earlier one's
            prompts = prompt_set(r)
            if offline:
                out.setdefault("offline_32", []).append(_offline_generate(*offline, prompts))
            cpu0 = _cpu_s(proc.pid) + _own_cpu_s()
            runs.append(asyncio.run(_level(port, model, prompts, max_tokens, 32, extra)))
            runs[-1]["cpu_s_server_and_client"] = _cpu_s(proc.pid) + _own_cpu_s() - cpu0
        best = sorted(runs, key=lambda x: x["output_tok_per_s"])[len(runs) // 2]  # the median run's figures
        out["32"] = {**best, "output_tok_per_s_runs": [x["output_tok_per_s"] for x in runs],
                     "cpu_s_runs": [x["cpu_s_server_and_client"] for x in runs]}
        out["load_average_after"] = os.getloadavg()
        return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _offline_generate(llm, params, prompts) -> dict:
    cpu0, t0 = _own_cpu_s(), time.perf_counter()
    outs = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - t0, _own_cpu_s() - cpu0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(prompts), "output_tokens": n, "wall_s": wall, "output_tok_per_s": n / wall, "cpu_s": cpu}


def _offline_ttft(llm, params, prompts) -> dict:
    """``LLM.stream`` time to the first text of each prompt, one after another, each run to its end as served
    (a request ended early would leave a different prefix cache behind)."""
    out = []
    for prompt in prompts:
        t0, first = time.perf_counter(), None
        for u in llm.stream(prompt, params):
            if u.delta_text and first is None:
                first = time.perf_counter() - t0
        out.append(first)
    return {"ttft_p50_ms": _pct(out, 50) * 1e3, "ttft_ms": [round(x * 1e3, 1) for x in out]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="GGUF file (default: the built-in SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--single-requests", type=int, default=8, help="requests sent one after another at 1 client")
    ap.add_argument("--reps", type=int, default=3, help="32-client runs of the engine, each paired with an offline one")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--serve-args", default="", help="more `engine serve` options, e.g. '--loop asyncio --http h11'")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--llamacpp-pythonpath", default=None,
                    help="PYTHONPATH for the llama_cpp.server process only (where llama-cpp-python is installed)")
    args = ap.parse_args()
    from engine.core.engine.llm import LLM
    from engine.core.engine.sampling_params import SamplingParams
    from engine.core.loader.checkpoint import default_model_path
    from engine.core.serving.logit_bias import LogitBias

    model = args.model or default_model_path()
    env = {**os.environ, "ENGINE_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "cpu": _cpu_name(), "threads": args.threads, "model": os.path.basename(model),
              "max_tokens": args.max_tokens, "serve_args": args.serve_args, "load_average_start": os.getloadavg()}
    os.environ["ENGINE_NUM_THREADS"] = str(args.threads)  # as the servers get it
    llm = LLM(model, max_num_seqs=64)
    eos = sorted(set(llm.tokenizer.eos_token_ids) | set(llm.config.eos_token_ids))
    bias = {str(t): -100 for t in eos}
    length = len(llm.tokenizer.encode(REPEATED))
    fresh = fresh_prompts(llm.tokenizer, args.single_requests, length, [REPEATED, *WARMUP, *PROMPTS_ALL])
    result["prompt_tokens"] = length
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True,
                            logits_processors=[LogitBias(bias, llm.config.vocab_size)])
    llm.generate(WARMUP, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up at full batch
    list(llm.stream(REPEATED, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))  # seen, as served
    gc.freeze()  # as `engine serve` does once its model is loaded (cli.resume_gc): the same collector work per step
    if not args.skip_engine:
        port = _free_port()
        eng = result["engine"] = _run_server(
            [sys.executable, "-m", "engine.core.cli", "serve", "--model", model, "--port", str(port), "--log-level",
             "warning", *args.serve_args.split()], port, args.max_tokens, {"ignore_eos": True, "logit_bias": bias},
            fresh, args.reps, env,
            offline=(llm, params))
        pairs = [1 - e / o["output_tok_per_s"] for e, o in zip(eng["32"]["output_tok_per_s_runs"], eng["offline_32"],
                                                              strict=True)]
        result["engine_server_overhead_runs"] = pairs
        result["engine_server_overhead"] = sorted(pairs)[len(pairs) // 2]
        # CPU time (server process and load generator vs the offline process) is less sensitive to other jobs on
        # the host than wall clock: the served path's extra work, whatever the host is doing.
        cpu = [s / o["cpu_s"] - 1 for s, o in zip(eng["32"]["cpu_s_runs"], eng["offline_32"], strict=True)]
        result["engine_server_extra_cpu_runs"] = cpu
        for level in ("1_repeated", "1_fresh"):
            offline = eng[f"offline_{level}"]["ttft_p50_ms"]
            result[f"engine_server_path_ms_{level}"] = eng[level]["ttft_p50_ms"] - offline
        print(json.dumps(result["engine"]), file=sys.stderr, flush=True)
    del llm
    if not args.skip_llamacpp:
        port = _free_port()
        lenv = dict(env)
        if args.llamacpp_pythonpath:
            lenv["PYTHONPATH"] = args.llamacpp_pythonpath
        result["llamacpp"] = _run_server(
            [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--n_ctx", "4096",
             "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
             "--interrupt_requests", "False"], port, args.max_tokens, {"logit_bias": bias}, fresh, 1, lenv)
        if not args.skip_engine:
            eng, lcp = result["engine"], result["llamacpp"]
            result["ratio_32_clients_tok_per_s"] = eng["32"]["output_tok_per_s"] / lcp["32"]["output_tok_per_s"]
            for level in ("1_repeated", "1_fresh"):
                result[f"ratio_ttft_p50_{level}"] = eng[level]["ttft_p50_ms"] / lcp[level]["ttft_p50_ms"]
    result["load_average_end"] = os.getloadavg()
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
