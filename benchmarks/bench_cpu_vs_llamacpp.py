"""engine vs llama.cpp (llama-cpp-python) vs HF transformers on CPU, on the same GGUF (the built-in default model,
SmolLM2-135M-Instruct Q4_1), same prompts, greedy decoding, fixed output lengths (EOS ignored), same thread count.

Measures, each system in its own subprocess (so one's threads never compete with another's):

- (a) single-stream decode: one ~64-token chat prompt, 128 greedy output tokens. The first token's arrival is timed
  separately, so decode tok/s = (128 - 1) / (t_last - t_first) excludes prefill; also ms/token and TTFT.
- (b) prompt processing: one 512-token prompt (random token ids from --seed), timed to the first generated token;
  prompt tok/s = 512 / TTFT.
- (c) throughput: 32 concurrent requests (random ids, lengths 32..64 from --seed) x 128 output tokens; output tok/s
  over the whole run, prefill included.
- (d) time to first token of a 43-token prompt (random ids), best of --repeat.
- (e) start-up: the model load inside the worker (engine: ``LLM()``, tokenizer and KV cache included; llama.cpp:
  ``llama_model_load_from_file``, its vocabulary included), and the whole command timed from outside, best of
  --repeat fresh processes: ``engine generate --max-tokens 1 Hi`` (imports, platform, load, chat template, one
  token) and, for llama.cpp, a process that imports llama_cpp, loads the model, makes a context and decodes the same
  chat prompt to one token. ``--startup-only`` measures (e) alone (a minute instead of ten).
- (f) engine only: the share of a single-stream decode step spent outside the native kernels (Python, dispatch,
  allocation, scheduler, sampler, torch ops such as the sampler's argmax): 1 - (native kernel time per token, every
  pybind kernel call timed by a perf_counter pair, over one request's decode steps) / (the ms/token of that same
  timed run; the untimed ms/token of the same request, run just before, is reported beside it). The timing
  wrappers' own cost lands in that run's host time: calls per token x their cost per call, both printed. A second
  row measures it with nothing added to the kernels: over one request's untimed decode steps, 1 - (the time inside
  the single-stream decode graph's replay, one perf_counter pair a step) / (those steps' wall time).
- (g) single-stream decode tok/s as a share of the bandwidth bound: the streaming read (a plain fp32 sum over as
  many bytes as a decode token's weights, the same threads) / those bytes. The read is taken in each system's
  process just before and just after its (a) runs, and their mean is the bound; a read in a process of its own at
  the end is printed below the table too.

The engine runs once per native ISA this CPU runs (``--isas``, default: all but scalar; ENGINE_CPU_ISA forces each,
and ONEDNN_MAX_CPU_ISA caps torch's oneDNN GEMMs to match)
and per ``--activation-quant`` choice (default: none and q8), each configuration with its own ratios to llama.cpp.

How each system runs them:

- engine: ``LLM`` (fp32 activations, GGUF kernels, prefix caching off so repeats recompute, decode steps of up to 32
  sequences replaying recorded kernel calls: the CPU decode graphs; ``--eager`` adds runs without them); (a) and (b)
  step the engine and time each token's arrival; (c) is one ``LLM.generate`` of the 32 prompts with
  ``SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)``. Threads: ENGINE_NUM_THREADS and
  ``torch.set_num_threads``.
- llama.cpp: the low-level llama-cpp-python API (``llama_batch_init`` / ``llama_decode``), greedy argmax of the logits
  in numpy; (c) is llama.cpp's batched decode, as in its ``batched`` example: every prompt prefilled in one batch with
  its own seq_id (n_seq_max=32), then one ``llama_decode`` of 32 tokens per step. n_threads = n_threads_batch.
- HF transformers: ``from_pretrained(dir, gguf_file=name)`` dequantised to fp32, ``generate(do_sample=False,
  min_new_tokens=n)``; a streamer times the tokens; (c) is one ``generate`` on the left-padded batch (skip it with
  ``--no-hf-batch``; it is the slowest part of the run).

Before timing, the greedy tokens of the chat prompt are compared: the number of leading tokens where engine and
llama.cpp (and engine and HF) agree. They use different arithmetic, so they may diverge after a while.

llama-cpp-python is a benchmark-only dependency (it builds from its sdist in minutes; it is not in pyproject):

    CMAKE_BUILD_PARALLEL_LEVEL=2 pip install --no-deps llama-cpp-python
    python benchmarks/bench_cpu_vs_llamacpp.py                  # the full run, all cores
    python benchmarks/bench_cpu_vs_llamacpp.py --threads 1 --json out.json
    python benchmarks/bench_cpu_vs_llamacpp.py --quick          # tiny shapes, a smoke test
    python benchmarks/bench_cpu_vs_llamacpp.py --startup-only   # (e) alone
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _helpers():
    """_model_path, _chat_ids and _agree from bench_engine_vs_hf.py, beside this file."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import bench_engine_vs_hf as b

    return b


def _decode_rates(times: list[float], t0: float) -> dict:
    """From the arrival times of the output tokens (perf_counter) and the request's start: TTFT and decode rates."""
    ttft = times[0] - t0
    n = len(times) - 1
    decode = times[-1] - times[0]
    return {"ttft_s": ttft, "decode_s": decode, "decode_tok_per_s": n / decode if decode > 0 else 0.0,
            "ms_per_token": 1000 * decode / n if n else 0.0, "total_s": times[-1] - t0}


# ---- engine ------------------------------------------------------------------------------------------------------
def _single_stream(run, w: dict) -> dict:
    """(a) and (b) for one system, given run(ids, n) -> (tokens, arrival times, t0): a warm-up, then the best of
    w["repeat"] runs of the chat prompt (decode rates) and of the long prompt (time to first token)."""
    run(w["warm"], 4)
    read_before = _read_bandwidth(w)
    runs = [run(w["chat"], w["single_out"]) for _ in range(w["repeat"])]
    read_after = _read_bandwidth(w)
    prefill = []
    for _ in range(w["repeat"]):
        _, tm, t0 = run(w["long"], 1)
        prefill.append(tm[0] - t0)
    return {"single_tokens": runs[0][0], "prefill_s": min(prefill), "read_around_decode": (read_before, read_after),
            "single": max((_decode_rates(tm, t0) for _, tm, t0 in runs), key=lambda r: r["decode_tok_per_s"])}


def _read_bandwidth(w: dict) -> float:
    """(g)'s streaming read, taken in the decoding process just before and just after its single-stream runs: on a
    host whose speed changes by the minute, a read measured elsewhere at another time says little of the decode's."""
    import torch

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from bench_cpu_gguf_linear import read_bandwidth

    threads = torch.get_num_threads()
    torch.set_num_threads(w["threads"])
    try:
        return read_bandwidth(w["bytes_per_token"])
    finally:
        torch.set_num_threads(threads)


def _ttft(run, w: dict) -> float:
    """(d): the best time to first token of the short prompt."""
    return min(tm[0] - t0 for _, tm, t0 in (run(w["short"], 1) for _ in range(w["repeat"])))


def _host_share(eng, prompt: list[int], n: int, params_cls) -> dict:
    """(f): one request's decode steps run with every native kernel timed (ms per token inside
    engine.platforms.cpu._native's functions, each call wrapped in a perf_counter pair); the host share is
    1 - kernel / wall of that same run (the wrappers' own ~0.3 us a call count as host time). Measured in one run,
    so a change of load on the machine moves both alike; the untimed ms/token (best of two runs just before) is
    reported beside it. The wrappers are installed on the module, where the kernel wrappers look the functions up,
    and the CPU decode graphs are captured again with them in place, so replayed calls are timed too (cProfile,
    used before, sees no call a ``functools.partial`` makes from C)."""
    from engine.platforms.cpu import _native

    spent = [0.0, 0]  # seconds inside the timed kernels, timed calls

    def decode() -> float:
        eng.add_request(list(prompt), params_cls(temperature=0.0, max_tokens=n, ignore_eos=True))
        eng.step()  # the prefill and first token, not counted
        spent[0], spent[1] = 0.0, 0
        t = time.perf_counter()
        while eng.has_unfinished():
            eng.step()
        return 1000 * (time.perf_counter() - t) / (n - 1)

    clock = time.perf_counter
    decode()  # captures the single-stream decode graph, where the engine uses graphs
    runs = [_untimed_decode(eng, decode, n - 1, clock) for _ in range(2)]
    wall_ms = min(w for w, _ in runs)
    shares = [1 - r / w for w, r in runs if r is not None]

    def timed(fn):
        def call(*args):
            t = clock()
            try:
                return fn(*args)
            finally:
                spent[0] += clock() - t
                spent[1] += 1
        return call

    def wrapper_cost() -> float:
        """Seconds one timed call adds to a step beyond the untimed call (best of 5 x 20000 calls of a native
        function that does no work): time the timing itself makes, which the host share above counts as host."""
        bare, wrapped = _native.num_threads, timed(_native.num_threads)
        best = float("inf")
        for _ in range(5):
            t = clock()
            for _ in range(20000):
                wrapped()
            t1 = clock()
            for _ in range(20000):
                bare()
            best = min(best, ((t1 - t) - (clock() - t1)) / 20000)
        return best

    originals = {k: getattr(_native, k) for k in dir(_native) if not k.startswith("_")
                 and callable(getattr(_native, k))}
    graphs = eng.runner.graphs
    try:
        for k, fn in originals.items():
            setattr(_native, k, timed(fn))
        if graphs is not None and graphs.lazy:
            graphs.forget()
            eng.add_request(list(prompt[:8]), params_cls(temperature=0.0, max_tokens=4, ignore_eos=True))
            while eng.has_unfinished():  # captures the single-stream graph again, through the timed kernels
                eng.step()
        timed_wall = decode()
    finally:
        for k, fn in originals.items():
            setattr(_native, k, fn)
        if graphs is not None and graphs.lazy:
            graphs.forget()
    kernel_ms = 1000 * spent[0] / (n - 1)
    # The timed run's host time includes the timing wrappers' own cost: calls per token x wrapper_us, reported.
    return {"wall_ms_per_token": wall_ms, "timed_wall_ms_per_token": timed_wall, "kernel_ms_per_token": kernel_ms,
            "host_ms_per_token": timed_wall - kernel_ms, "host_share": (timed_wall - kernel_ms) / timed_wall,
            "kernel_calls_per_token": spent[1] / (n - 1), "wrapper_us_per_call": 1e6 * wrapper_cost(),
            "untimed_host_share": sum(shares) / len(shares) if shares else None}


def _untimed_decode(eng, decode, steps: int, clock) -> tuple[float, float | None]:
    """(ms per token of one untimed single-stream decode of ``steps`` decode steps after its prefill, ms per token
    of them inside the decode graph's replay): the replay, every native kernel of the step, is timed as a whole
    (one perf_counter pair a step, none per kernel; the prefill runs eagerly, outside it). The second is None
    without a captured single-stream CPU graph."""
    graphs = eng.runner.graphs
    hit = None if graphs is None else graphs.graphs.get(1)
    if hit is None:
        return decode(), None
    replay, inside = hit[0], [0.0]

    def timed_replay():
        t = clock()
        replay()
        inside[0] += clock() - t

    graphs.graphs[1] = (timed_replay, *hit[1:])
    try:
        wall_ms = decode()
    finally:
        graphs.graphs[1] = hit
    return wall_ms, 1000 * inside[0] / steps


def decode_bytes_per_token(path: str) -> int:
    """Weight bytes one decode token reads: every tensor of the GGUF file but the token embedding, of which it reads
    one row, unless the file has no output.weight (tied embeddings: the LM head then reads all of it)."""
    from engine.core.loader.gguf_file import open_gguf

    tensors = {t.name: t.n_bytes for t in open_gguf(path).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if tied or name != "token_embd.weight")


def bandwidth_worker(w: dict) -> dict:
    """The streaming read bandwidth with the benchmark's threads (bench_cpu_gguf_linear.read_bandwidth over as many
    bytes as a decode token reads): the bound a single-stream decode token cannot beat."""
    import torch

    torch.set_num_threads(w["threads"])
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from bench_cpu_gguf_linear import read_bandwidth

    return {"read_bytes_per_s": read_bandwidth(w["bytes_per_token"])}


def engine_worker(w: dict) -> dict:
    import torch

    torch.set_num_threads(w["threads"])
    from engine.core.engine.llm import LLM
    from engine.core.engine.sampling_params import SamplingParams

    t = time.perf_counter()
    llm = LLM(dtype="float32", enable_prefix_caching=False, activation_quant=w.get("activation_quant", "none"),
              enforce_eager=w.get("eager", False))
    load = time.perf_counter() - t
    from engine.platforms.cpu import _native
    if w.get("startup_only"):
        return {"load_s": load, "threads": torch.get_num_threads(), "isa": _native.isa(),
                "activation_quant": llm.activation_quant}
    eng = llm.engine

    def timed(prompt: list[int], n: int) -> tuple[list[int], list[float], float]:
        eng.add_request(list(prompt), SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        toks: list[int] = []
        times: list[float] = []
        t0 = time.perf_counter()
        while eng.has_unfinished():
            for u in eng.step():
                if u.new_token_ids:
                    now = time.perf_counter()
                    toks += u.new_token_ids
                    times += [now] * len(u.new_token_ids)
        return toks, times, t0

    out: dict = {"load_s": load, "threads": torch.get_num_threads(), "isa": _native.isa(),
                 "activation_quant": llm.activation_quant, **_single_stream(timed, w), "ttft43_s": _ttft(timed, w)}
    if w["batch"]:
        params = SamplingParams(temperature=0.0, max_tokens=w["batch_out"], ignore_eos=True)
        t0 = time.perf_counter()
        res = llm.generate(w["batch"], params)
        wall = time.perf_counter() - t0
        n = sum(len(r.outputs[0].token_ids) for r in res)
        out["batch"] = {"wall_s": wall, "output_tokens": n, "output_tok_per_s": n / wall}
    out["host"] = _host_share(eng, w["chat"], w["single_out"], SamplingParams)
    return out


# ---- llama.cpp ---------------------------------------------------------------------------------------------------
def llamacpp_worker(w: dict) -> dict:
    import ctypes

    import llama_cpp as L
    import numpy as np

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept referenced while llama.cpp may log
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    t = time.perf_counter()
    mparams = L.llama_model_default_params()
    # Extra buffer types are AMX and the repacked layouts. On x86 this llama.cpp repacks neither Q4_1 nor Q8_0, so
    # turning them off only turns off AMX, whose tile kernels die with SIGILL on this (virtual) Sapphire Rapids.
    mparams.use_extra_bufts = w["extra_bufts"]
    model = L.llama_model_load_from_file(w["model"].encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {w['model']}")
    load = time.perf_counter() - t
    info = {"load_s": load, "threads": w["threads"], "version": L.__version__,
            "system_info": L.llama_print_system_info().decode(errors="replace").strip()}
    if w.get("startup_only"):
        return info
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def context(n_ctx: int, n_seq: int, n_batch: int):
        p = L.llama_context_default_params()
        p.n_ctx, p.n_seq_max, p.n_batch, p.n_ubatch = n_ctx, n_seq, n_batch, min(n_batch, 512)
        p.n_threads = p.n_threads_batch = w["threads"]
        p.no_perf = True
        ctx = L.llama_init_from_model(model, p)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        return ctx

    def fill(batch, items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, position, seq_id, wants logits)."""
        for i, (tok, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, logits
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(items)

    def decode(ctx, batch, n_out: int) -> np.ndarray:
        """Run the batch; the argmax of each of its n_out output rows (in batch order)."""
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n_out, vocab))
        return logits.argmax(axis=1)

    ctx = context(1024, 1, 512)
    batch = L.llama_batch_init(512, 0, 1)
    mem = L.llama_get_memory(ctx)

    def single(prompt: list[int], n: int) -> tuple[list[int], list[float], float]:
        L.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        fill(batch, [(tok, i, 0, i == len(prompt) - 1) for i, tok in enumerate(prompt)])
        toks = [int(decode(ctx, batch, 1)[0])]
        times = [time.perf_counter()]
        for k in range(1, n):
            fill(batch, [(toks[-1], len(prompt) + k - 1, 0, True)])
            toks.append(int(decode(ctx, batch, 1)[0]))
            times.append(time.perf_counter())
        return toks, times, t0

    out: dict = {**info, **_single_stream(single, w), "ttft43_s": _ttft(single, w)}
    L.llama_batch_free(batch)
    L.llama_free(ctx)

    prompts = w["batch"]
    if prompts:
        n_seq, n_out = len(prompts), w["batch_out"]
        per_seq = max(len(p) for p in prompts) + n_out
        total = sum(len(p) for p in prompts)
        ctx = context(n_seq * (per_seq + 64), n_seq, max(total, n_seq))
        batch = L.llama_batch_init(max(total, n_seq), 0, 1)
        t0 = time.perf_counter()
        items = [(tok, i, s, i == len(p) - 1) for s, p in enumerate(prompts) for i, tok in enumerate(p)]
        fill(batch, items)
        last = decode(ctx, batch, n_seq)  # one output row per sequence, in sequence order
        produced = n_seq
        for k in range(1, n_out):
            fill(batch, [(int(last[s]), len(prompts[s]) + k - 1, s, True) for s in range(n_seq)])
            last = decode(ctx, batch, n_seq)
            produced += n_seq
        wall = time.perf_counter() - t0
        out["batch"] = {"wall_s": wall, "output_tokens": produced, "output_tok_per_s": produced / wall,
                        "n_ctx": L.llama_n_ctx(ctx)}
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)
    return out


# ---- HF transformers ---------------------------------------------------------------------------------------------
def hf_worker(w: dict) -> dict:
    import torch

    torch.set_num_threads(w["threads"])
    from transformers import AutoModelForCausalLM
    from transformers.generation.streamers import BaseStreamer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = w["model"]
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    load = time.perf_counter() - t
    pad = 0  # any id: left padding is masked out

    class Clock(BaseStreamer):
        """Records when each generated token arrives (the first put() is the prompt)."""

        def __init__(self):
            self.times: list[float] = []
            self.seen_prompt = False

        def put(self, value):
            if self.seen_prompt:
                self.times.append(time.perf_counter())
            self.seen_prompt = True

        def end(self):
            pass

    def single(prompt: list[int], n: int) -> tuple[list[int], list[float], float]:
        ids = torch.tensor([prompt])
        clock = Clock()
        with torch.inference_mode():
            t0 = time.perf_counter()
            y = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=pad, streamer=clock)
        return y[0, ids.shape[1]:].tolist(), clock.times, t0

    out: dict = {"load_s": load, "threads": torch.get_num_threads(), **_single_stream(single, w),
                 "ttft43_s": _ttft(single, w)}
    prompts = w["batch"]
    if prompts:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            t0 = time.perf_counter()
            y = model.generate(ids, attention_mask=mask, max_new_tokens=w["batch_out"],
                               min_new_tokens=w["batch_out"], do_sample=False, pad_token_id=pad)
            wall = time.perf_counter() - t0
        n = (y.shape[1] - width) * len(prompts)
        out["batch"] = {"wall_s": wall, "output_tokens": n, "output_tok_per_s": n / wall}
    return out


def llamacpp_one_token(w: dict) -> dict:
    """(e) for llama.cpp, a whole process's work: import, load, a context, the chat prompt decoded to one token."""
    import ctypes

    import llama_cpp as L
    import numpy as np

    quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.use_extra_bufts = w["extra_bufts"]
    model = L.llama_model_load_from_file(w["model"].encode(), mparams)
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch = 512, 512
    p.n_threads = p.n_threads_batch = w["threads"]
    ctx = L.llama_init_from_model(model, p)
    prompt = w["hi"]
    batch = L.llama_batch_init(len(prompt), 0, 1)
    for i, tok in enumerate(prompt):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, i == len(prompt) - 1
        batch.seq_id[i][0] = 0
    batch.n_tokens = len(prompt)
    if L.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    token = int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,)).argmax())
    return {"token": token}


WORKERS = {"engine": engine_worker, "llama.cpp": llamacpp_worker, "hf": hf_worker,
           "llama.cpp-one-token": llamacpp_one_token, "bandwidth": bandwidth_worker}


# ---- orchestration -----------------------------------------------------------------------------------------------
def run_worker(kind: str, spec: dict, threads: int, env_extra: dict | None = None, timed: list | None = None) -> dict:
    """Run a worker in a fresh process; its JSON result. ``timed`` (a list) gets the process's wall seconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = dict(os.environ, ENGINE_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), **(env_extra or {}))
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--spec", f.name], capture_output=True,
                              text=True, env=env)
    finally:
        os.unlink(f.name)
    wall = time.perf_counter() - t
    if timed is not None:
        timed.append(wall)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed:\n{proc.stderr[-3000:]}")
    print(f"  {kind:9} {env_extra or ''} done in {wall:6.1f} s", file=sys.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def startup_worker(kind: str, spec: dict, threads: int, repeat: int, env_extra: dict | None = None) -> dict:
    """(e) alone: the worker's result from the fresh process with the fastest model load."""
    runs = [run_worker(kind, dict(spec, startup_only=True), threads, env_extra) for _ in range(repeat)]
    return min(runs, key=lambda r: r["load_s"])


def llamacpp_startup(spec: dict, threads: int, repeat: int) -> float:
    """(e) for llama.cpp: the best wall time of a fresh process that loads the model and decodes one token."""
    walls: list[float] = []
    for _ in range(repeat):
        run_worker("llama.cpp-one-token", spec, threads, timed=walls)
    return min(walls)


# A forced ISA also caps torch's oneDNN (the GGUF prefill GEMM, platforms/cpu/kernels/onednn_gemm.py), so that a
# forced-AVX2 run on an AVX-512 CPU stands in for an AVX2-only machine.
ONEDNN_ISA_CAP = {"avx2": "AVX2", "scalar": "SSE41"}


def isa_env(isa: str) -> dict:
    """The environment that runs the engine on ``isa``: ENGINE_CPU_ISA, and oneDNN capped to match."""
    return {"ENGINE_CPU_ISA": isa, **({"ONEDNN_MAX_CPU_ISA": ONEDNN_ISA_CAP[isa]} if isa in ONEDNN_ISA_CAP else {})}


def generate_startup(isa: str, threads: int, repeat: int) -> float:
    """(e): the best wall time of a fresh ``engine generate --max-tokens 1`` (imports, platform, load, one token)."""
    env = dict(os.environ, ENGINE_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), **isa_env(isa))
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "engine.core.cli", "generate", "--max-tokens", "1", "Hi"],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"engine generate failed:\n{proc.stderr[-3000:]}")
        best = min(best, time.perf_counter() - t)
    return best


def cpu_description() -> str:
    """lscpu's model name and the SIMD extensions that matter here."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{name} ({os.cpu_count()} CPUs; {' '.join(isa) or 'no x86 SIMD flags'})"


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.1f}" if isinstance(x, float) else str(x)


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _ratio(x, y) -> str:
    return "—" if x is None or y is None or y == 0 else f"{x / y:.2f}"


def table(res: dict, a) -> str:
    """One column per engine configuration, llama.cpp and HF; then each engine configuration over llama.cpp."""
    engines = res["engines"]  # label -> result
    c, h = res["llama.cpp"], res.get("hf")

    def get(r, *keys):
        for k in keys:
            if r is None or k not in r:
                return None
            r = r[k]
        return r

    def ms(*keys):
        return lambda r: None if get(r, *keys) is None else 1000 * get(r, *keys)

    rows = [
        (f"(a) decode tok/s, 1 stream, {len(res['chat_ids'])} in / {a.single_out} out",
         lambda r: get(r, "single", "decode_tok_per_s"), True),
        ("(a) ms/token (decode)", lambda r: get(r, "single", "ms_per_token"), False),
        (f"(b) prompt tok/s, {a.long_in}-token prompt", lambda r: None if r is None else a.long_in / r["prefill_s"],
         True),
        (f"(c) output tok/s, {a.batch} requests x {a.batch_in_min}..{a.batch_in_max} in / {a.batch_out} out",
         lambda r: get(r, "batch", "output_tok_per_s"), True),
        (f"(d) time to first token, {a.short_in}-token prompt, ms", ms("ttft43_s"), False),
        ("(e) model load, ms", ms("load_s"), False),
        ("(e) whole command to one token (engine: `engine generate --max-tokens 1 Hi`), ms",
         ms("generate_startup_s"), False),
        ("(g) single-stream decode as % of the bandwidth bound (the mean of streaming reads just before and after "
         "it, in its process / weight bytes per token)",
         lambda r: None if get(r, "single", "decode_tok_per_s") is None or not r.get("read_around_decode")
         else 100 * r["single"]["decode_tok_per_s"] * res["bytes_per_token"] / _mean(r["read_around_decode"]), None),
        ("(g) those streaming reads, GB/s",
         lambda r: None if not (r or {}).get("read_around_decode")
         else "-".join(f"{x / 1e9:.1f}" for x in sorted(r["read_around_decode"])), None),
        ("(f) engine host overhead: % of a decode step outside native kernels",
         lambda r: None if get(r, "host", "host_share") is None else 100 * r["host"]["host_share"], None),
        ("(f) same, untimed: 1 - (time inside the decode graph's replay) / (the same untimed steps' wall)",
         lambda r: None if get(r, "host", "untimed_host_share") is None else 100 * r["host"]["untimed_host_share"],
         None),
        ("(f) engine native kernels, ms per decode token", lambda r: get(r, "host", "kernel_ms_per_token"), None),
        ("(f) engine host (outside the kernels), ms per decode token", lambda r: get(r, "host", "host_ms_per_token"),
         None),
        ("(f) native kernel calls per decode token x the timing wrapper's own cost per call (us), in the host time",
         lambda r: None if get(r, "host", "wrapper_us_per_call") is None
         else f"{r['host']['kernel_calls_per_token']:.0f} x {r['host']['wrapper_us_per_call']:.2f}", None),
    ]
    if a.startup_only:
        rows = [r for r in rows if r[0].startswith("(e)")]
    names = list(engines) + ["llama.cpp"] + (["HF"] if h else [])
    systems = list(engines.values()) + [c] + ([h] if h else [])
    lines = ["| metric | " + " | ".join(names) + " | " + " | ".join(f"{n} / llama.cpp" for n in engines) + " |",
             "| --- |" + " ---: |" * (len(names) + len(engines))]
    for label, f, higher_better in rows:
        vals = [f(r) for r in systems]
        ratios = ["" if higher_better is None else _ratio(f(r), f(c)) if higher_better else _ratio(f(c), f(r))
                  for r in engines.values()]
        lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in vals) + " | " + " | ".join(ratios) + " |")
    for other in ("llama.cpp", "hf"):
        if other in res["agree"]:
            cells = [_fmt(res["agree"][other].get(n)) for n in engines] + [""] * len(names)
            lines.append(f"| greedy tokens agreeing with {other} (of {a.single_out}) | " + " | ".join(cells) + " |")
    lines += ["", "Ratios: engine over llama.cpp for rates, llama.cpp over engine for times (above 1: engine ahead)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help="threads for every system (default: all CPUs)")
    p.add_argument("--single-out", type=int, default=128, help="(a) output tokens")
    p.add_argument("--long-in", type=int, default=512, help="(b) prompt tokens")
    p.add_argument("--batch", type=int, default=32, help="(c) concurrent requests")
    p.add_argument("--batch-in-min", type=int, default=32)
    p.add_argument("--batch-in-max", type=int, default=64)
    p.add_argument("--batch-out", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="run (a) and (b) this many times, keep the fastest")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hf", action="store_true", help="skip HF transformers entirely")
    p.add_argument("--no-hf-batch", action="store_true", help="skip HF for (c) (its slowest part)")
    p.add_argument("--llamacpp-amx", action="store_true",
                   help="let llama.cpp use its extra buffer types (AMX on a CPU that has it; off: SIGILL here)")
    p.add_argument("--short-in", type=int, default=43, help="(d) prompt tokens")
    p.add_argument("--isas", default=None,
                   help="comma-separated ENGINE_CPU_ISA values for the engine runs (default: every one this CPU runs "
                        "but scalar)")
    p.add_argument("--activation-quant", default="none,q8", help="comma-separated engine activation_quant values")
    p.add_argument("--eager", action="store_true",
                   help="also run each engine configuration with enforce_eager=True (no CPU decode graphs), labelled "
                        "'eager': the graphs' before/after in one run")
    p.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp (no ratios)")
    p.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    p.add_argument("--startup-only", action="store_true", help="measure (e), the start-up, alone")
    p.add_argument("--json", help="also write all results to this file")
    a = p.parse_args(argv)
    if a.worker:
        with open(a.spec, encoding="utf-8") as f:
            spec = json.load(f)
        print(json.dumps(WORKERS[a.worker](spec)))
        return 0
    if a.quick:
        a.single_out, a.long_in, a.batch, a.batch_in_min, a.batch_in_max, a.batch_out, a.repeat = 16, 64, 4, 8, 16, 8, 1
        a.short_in = min(a.short_in, 16)
    a.threads = a.threads or os.cpu_count() or 1
    b = _helpers()
    from engine.core.cli_bench import random_prompts

    vocab = 49152  # SmolLM2's vocabulary; every id below it is valid for all three
    rng = random.Random(a.seed)
    lens = [rng.randint(a.batch_in_min, a.batch_in_max) for _ in range(a.batch)]
    chat = b._chat_ids()
    from engine.core.loader import load_checkpoint

    tok = load_checkpoint(None).tokenizer
    hi = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True),
                    add_special_tokens=False)  # what `engine generate Hi` sends
    spec = {"model": b._model_path(), "threads": a.threads, "extra_bufts": a.llamacpp_amx, "repeat": a.repeat,
            "single_out": a.single_out, "batch_out": a.batch_out, "chat": chat, "hi": hi,
            "warm": random_prompts(1, 8, vocab, a.seed + 99)[0],
            "long": random_prompts(1, a.long_in, vocab, a.seed + 1)[0],
            "short": random_prompts(1, a.short_in, vocab, a.seed + 2)[0],
            "batch": random_prompts(a.batch, lens, vocab, a.seed) if a.batch else []}
    spec["bytes_per_token"] = decode_bytes_per_token(spec["model"])
    t0, load0 = time.perf_counter(), os.getloadavg()
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "chat_ids": chat, "args": {
        k: getattr(a, k) for k in ("threads", "single_out", "long_in", "batch", "batch_in_min", "batch_in_max",
                                   "batch_out", "repeat", "seed", "no_hf", "no_hf_batch",
                                   "llamacpp_amx", "short_in", "isas", "activation_quant")}}
    res["cpu"] = cpu_description()
    res["bytes_per_token"] = spec["bytes_per_token"]
    from engine.platforms.cpu import _native

    isas = a.isas.split(",") if a.isas else [i for i in _native.supported_isas() if i != "scalar"]
    res["engines"] = {}
    for isa in isas:
        startup = generate_startup(isa, a.threads, a.repeat)
        for aq in a.activation_quant.split(","):
            for eager in (False, True) if a.eager else (False,):
                env = isa_env(isa)
                wspec = dict(spec, activation_quant=aq, eager=eager)
                r = (startup_worker("engine", wspec, a.threads, a.repeat, env)
                     if a.startup_only else run_worker("engine", wspec, a.threads, env))
                r["generate_startup_s"] = startup
                label = f"engine {isa}" + ("" if aq == "none" else f" {aq}") + (" eager" if eager else "")
                res["engines"][label] = r
    if a.no_llamacpp:
        res["llama.cpp"] = None
    elif a.startup_only:
        res["llama.cpp"] = startup_worker("llama.cpp", spec, a.threads, a.repeat)
    else:
        res["llama.cpp"] = run_worker("llama.cpp", spec, a.threads)
    if res["llama.cpp"] is not None:
        res["llama.cpp"]["generate_startup_s"] = llamacpp_startup(spec, a.threads, a.repeat)
    if not a.no_hf and not a.startup_only:
        res["hf"] = run_worker("hf", dict(spec, batch=[] if a.no_hf_batch else spec["batch"]), a.threads)
    if not a.startup_only:
        bw = run_worker("bandwidth", spec, a.threads)["read_bytes_per_s"]
        res["bandwidth"] = {"read_bytes_per_s": bw, "bytes_per_token": spec["bytes_per_token"]}
        res["bound_tok_per_s"] = bw / spec["bytes_per_token"]
    res["agree"] = {} if a.startup_only else {
        k: {n: b._agree(e["single_tokens"], res[k]["single_tokens"]) for n, e in res["engines"].items()}
        for k in ("llama.cpp", "hf") if res.get(k)}
    res["total_s"] = time.perf_counter() - t0
    res["loadavg_start"] = load0
    c = res["llama.cpp"] or {"version": "(not run)", "system_info": "-"}
    print(f"\n{res['date']} UTC, {res['cpu']}; llama-cpp-python {c['version']}, {a.threads} threads each; "
          f"llama.cpp: {c['system_info']}\n")
    print(table(res, a))
    if res.get("bandwidth"):
        bw = res["bandwidth"]
        print(f"\n(g) bound: {bw['bytes_per_token'] / 1e6:.1f} MB of weights per decode token at a streaming read of "
              f"{bw['read_bytes_per_s'] / 1e9:.1f} GB/s ({a.threads} threads) = {res['bound_tok_per_s']:.0f} tok/s")
    print(f"\ntotal {res['total_s']:.0f} s; 1-minute load average at the start {load0[0]:.2f} on {os.cpu_count()} "
          "CPUs (other work on the machine makes these numbers noisy, OpenMP runtimes the most)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
