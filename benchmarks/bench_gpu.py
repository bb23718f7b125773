"""The cuda platform on an NVIDIA GPU, in one run: the hardware ceilings, every Triton kernel against its peer, and
the engine against HF transformers ``generate`` on random-weight Llama models, with the roofline of the same steps.

    python benchmarks/bench_gpu.py --out DIR             # everything (about 10 minutes on an H200)
    python benchmarks/bench_gpu.py --out DIR --only engine --quick
    BENCH_SHAPES=llama-8b BENCH_BATCHES=256 python benchmarks/bench_gpu.py --out DIR --only engine
    TRITON_INTERPRET=1 python benchmarks/bench_gpu.py --out DIR --tiny    # every section at its tiny size, no GPU

Writes DIR/bench_gpu.json and DIR/bench_gpu.md and prints the table. Kernel sections come from
benchmarks/gpu/<name>.py (each exposes ``run(tiny=False) -> list[dict]``); a section that fails is reported with its
traceback and the run goes on. Ratios are always against a peer measured in this same run.

``--tiny`` runs the same code at tiny sizes (a 2-layer random model, the kernel sections' TINY shapes), on the CPU
under the Triton interpreter where there is no GPU: what CI runs (tests/benchmarks), so that a rename cannot break
the benchmark unnoticed. Its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
KERNEL_SECTIONS = ("attention", "moe", "fp8", "quant", "int4", "int8", "gemv", "mla")


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ceilings(tiny: bool = False) -> dict:
    """Device-to-device copy bandwidth (bytes read + written) and the bf16 GEMM rate, measured here."""
    from benchmarks.gpu.ceilings import bf16_gemm_rate, copy_bandwidth

    if tiny:
        copy_bw, gemm = copy_bandwidth(_device(), 1 << 20), bf16_gemm_rate(_device(), 64)
    else:
        copy_bw, gemm = copy_bandwidth(), bf16_gemm_rate()
    return {"copy_bytes_per_s": copy_bw, "bf16_flops": gemm}


@dataclasses.dataclass(frozen=True)
class EngineSizes:
    """What the engine section runs: models, prompt and output lengths, batch sizes, profiled request counts."""
    quick: bool = False
    in_len: int = 128
    out_len: int = 128
    hf_single_out: int = 32  # HF's single request (its decode rate: a short run is enough)
    single_out: int = 129  # the engine's single request: 128 decode steps after the prompt
    profile_in: int = 16
    profile_out: int = 24
    max_num_batched_tokens: int = 8192
    max_model_len: int = 1024

    def shapes(self) -> list[tuple[str, dict]]:
        from engine.core.testing.random_model import LLAMA_1B, LLAMA_8B

        shapes = [("llama-1b", LLAMA_1B)] if self.quick else [("llama-8b", LLAMA_8B), ("llama-1b", LLAMA_1B)]
        if os.environ.get("BENCH_SHAPES"):
            shapes = [(n, s) for n, s in shapes if n in os.environ["BENCH_SHAPES"].split(",")]
        return shapes

    def batches(self, name: str) -> list[int]:
        if os.environ.get("BENCH_BATCHES"):  # e.g. BENCH_BATCHES=256 (the single-request row always runs)
            return [int(b) for b in os.environ["BENCH_BATCHES"].split(",")]
        return [64] if self.quick or name != "llama-8b" else [64, 256]

    def profiled(self, name: str) -> tuple[int, ...]:
        return (1, 64, 256) if name == "llama-8b" else (64,)


@dataclasses.dataclass(frozen=True)
class TinyEngineSizes(EngineSizes):
    """A 2-layer random Llama, 2 requests of 8 tokens in and out (no environment overrides)."""
    in_len: int = 8
    out_len: int = 8
    hf_single_out: int = 4
    single_out: int = 9
    profile_in: int = 4
    profile_out: int = 6
    max_num_batched_tokens: int = 256
    max_model_len: int = 64

    def shapes(self) -> list[tuple[str, dict]]:
        return [("tiny", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                              num_kv_heads=2))]

    def batches(self, name: str) -> list[int]:
        return [2]

    def profiled(self, name: str) -> tuple[int, ...]:
        return (2,)


# ---- engine vs HF ---------------------------------------------------------------------------------------------

def _prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def hf_generate(model_dir: str, n: int, in_len: int, out_len: int, vocab: int) -> float:
    """Output tokens per second of HF transformers ``generate`` on n same-length prompts as one batch."""
    import transformers

    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(_device()).eval()
    ids = torch.tensor(_prompts(n, in_len, vocab), device=_device())

    def go():
        with torch.no_grad():
            return hf.generate(ids, max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False,
                               pad_token_id=0, eos_token_id=None)

    go() if n <= 8 else None  # warm-up on small batches only (the large ones are long enough)
    _sync()
    t = time.perf_counter()
    out = go()
    _sync()
    dt = time.perf_counter() - t
    assert out.shape[1] == in_len + out_len
    return n * out_len / dt


def roofline_seconds(cfg, n: int, in_len: int, out_len: int, weight_bytes: int, ceil: dict) -> float:
    """Time of the same work at the ceilings: prefill FLOPs over the GEMM rate (or its bytes over the bandwidth),
    then each decode step's weight + KV bytes over the bandwidth (or its FLOPs over the GEMM rate)."""
    params = weight_bytes / 2  # bf16
    kv_tok = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2
    bw, rate = ceil["copy_bytes_per_s"], ceil["bf16_flops"]
    attn_flops = lambda q, ctx: 4 * q * ctx * cfg.num_heads * cfg.head_dim * cfg.num_layers  # noqa: E731
    total = max(2 * params * n * in_len + n * attn_flops(in_len, in_len / 2), 0) / rate
    total = max(total, weight_bytes / bw)
    for step in range(out_len - 1):
        ctx = in_len + step + 1
        total += max((weight_bytes + n * ctx * kv_tok) / bw, (2 * params * n + n * attn_flops(1, ctx)) / rate)
    return total


def engine_generate(llm, n: int, in_len: int, out_len: int, vocab: int) -> tuple[float, float, dict]:
    """(output tok/s, wall seconds, where the time went: prefill and decode-only step seconds from EngineStats)."""
    from engine import SamplingParams

    prompts = _prompts(n, in_len, vocab, seed=1)
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    # Warm-up on the same shapes: Triton compiles a kernel variant on first use of each specialization (an int
    # argument divisible by 16 or not, ...), which a server pays once; the timed run measures the steady state.
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    _sync()
    llm.engine.stats.reset()
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    _sync()
    dt = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == out_len for o in outs)
    st = llm.engine.stats
    split = {"prefill_s": st.prefill_time, "decode_s": st.decode_time, "steps": st.num_steps,
             "decode_step_ms": 1e3 * st.decode_time / max(st.num_steps - 1, 1)}
    return n * out_len / dt, dt, split


def graph_step_ms(llm, n: int, ctx: int) -> float | None:
    """Device time of one decode step of n sequences at context ``ctx``: the median replay of its captured graph,
    on inputs set up here (distinct KV blocks per sequence; the cache is idle). With the step's wall time beside
    it, this says whether a step waits on the host or on the device."""
    from benchmarks.gpu.ceilings import bench_us

    graphs, bs = llm.runner.graphs, llm.runner.block_size
    bucket = graphs.bucket_for(n) if graphs is not None else None
    if bucket is None:
        return None
    per = -(-ctx // bs)
    tables = [[i * per + j for j in range(per)] for i in range(n)]
    pos = ctx - 1
    with torch.inference_mode():  # the CPU platform's replay writes the step's inference tensors
        graphs.run(bucket, [3] * n, [pos] * n, [t[pos // bs] * bs + pos % bs for t in tables], tables, [ctx] * n)
        _sync()
        return bench_us(graphs.graphs[bucket][0], warmup=10, rep=100) / 1e3


def profile_decode(llm, n: int, vocab: int, out: Path, tag: str, in_len: int = 16, out_len: int = 24) -> dict:
    """Where a decode-heavy workload's time goes (n requests, 16 in / 24 out): device kernel time per step
    against the step's wall time (torch.profiler), and the host's Python functions (cProfile), written to out."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from engine import SamplingParams

    prompts = _prompts(n, in_len, vocab, seed=2)
    params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True)
    llm.generate(prompts, params)
    _sync()
    llm.engine.stats.reset()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        llm.generate(prompts, params)
        _sync()
        wall = time.perf_counter() - t
    ka = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in ka)
    steps = llm.engine.stats.num_steps
    prof_c = cProfile.Profile()
    prof_c.enable()
    llm.generate(prompts, params)
    _sync()
    prof_c.disable()
    buf = io.StringIO()
    pstats.Stats(prof_c, stream=buf).sort_stats("tottime").print_stats(30)
    text = (ka.table(sort_by="self_cpu_time_total", row_limit=30) + "\n\n"
            + ka.table(sort_by="self_device_time_total", row_limit=25) + "\n\ncProfile (host):\n" + buf.getvalue())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"profile_{tag}_{n}req.txt").write_text(text)
    res = {"n": n, "steps": steps, "wall_ms_per_step": 1e3 * wall / steps,
           "device_ms_per_step": device_us / 1e3 / steps, "async": llm.engine.async_scheduling}
    print(f"profile {tag} {n} req: {res}", flush=True)
    return res


def engine_section(ceil: dict, quick: bool, profile_dir: Path | None = None, tiny: bool = False) -> list[dict]:
    from engine import LLM
    from engine.core.engine.memory import weight_nbytes
    from engine.core.loader import load_checkpoint
    from engine.core.testing.random_model import write_random_llama

    rows = []
    sizes = TinyEngineSizes() if tiny else EngineSizes(quick=quick)
    in_len, out_len, single_out = sizes.in_len, sizes.out_len, sizes.single_out
    for name, shape in sizes.shapes():
        tmp = tempfile.mkdtemp(prefix=f"bench_{name}_")
        write_random_llama(tmp, **shape, max_position=4096, dtype=torch.bfloat16, device=_device())
        ckpt = load_checkpoint(tmp, torch.bfloat16)
        weight_bytes, cfg = weight_nbytes(ckpt.weights.values()), ckpt.config
        embed_bytes = weight_nbytes([ckpt.weights["model.embed_tokens.weight"]]) if not cfg.tie_word_embeddings else 0
        del ckpt
        batches = sizes.batches(name)
        hf = {b: hf_generate(tmp, b, in_len, out_len, cfg.vocab_size) for b in batches}
        hf[1] = hf_generate(tmp, 1, in_len, sizes.hf_single_out, cfg.vocab_size)
        print(f"{name}: HF generate tok/s {hf}", flush=True)
        _empty_cache()
        llm = LLM(tmp, dtype="bfloat16", max_num_seqs=max(batches), max_num_batched_tokens=sizes.max_num_batched_tokens,
                  enable_prefix_caching=False, max_model_len=sizes.max_model_len)
        for b in batches:
            llm.engine.async_scheduling = False  # the synchronous step order, as a same-run reference
            sync_tps, _, sync_split = engine_generate(llm, b, in_len, out_len, cfg.vocab_size)
            llm.engine.async_scheduling = True
            tps, dt, split = engine_generate(llm, b, in_len, out_len, cfg.vocab_size)
            roof = roofline_seconds(cfg, b, in_len, out_len, weight_bytes, ceil)
            goal = {64: 12, 256: 5}.get(b, 0) if name == "llama-8b" else 0
            rows.append({"bench": f"engine generate {name}", "shape": f"{b} req x {in_len} in / {out_len} out",
                         "tok_s": tps, "peer": "HF generate", "peer_tok_s": hf[b], "ratio": tps / hf[b],
                         "roofline_frac": roof / dt, "goal": f">= {goal}x HF, >= 70% roofline" if goal else "",
                         "met": bool(goal) and tps / hf[b] >= goal and roof / dt >= 0.7,
                         "sync_tok_s": sync_tps, "async_gain": tps / sync_tps,
                         "sync_decode_step_ms": sync_split["decode_step_ms"], **split,
                         "graph_step_ms": graph_step_ms(llm, b, in_len + out_len // 2)})
            print(rows[-1], flush=True)
        # single request: decode rate after the prompt, against the weight-read roofline
        llm.engine.async_scheduling = False
        sync_tps, _, sync_split = engine_generate(llm, 1, in_len, single_out, cfg.vocab_size)
        llm.engine.async_scheduling = True
        tps, dt, split = engine_generate(llm, 1, in_len, single_out, cfg.vocab_size)
        roof_tps = ceil["copy_bytes_per_s"] / weight_bytes
        rows.append({"bench": f"engine single request {name}", "shape": f"1 req x {in_len} in / {single_out} out",
                     "tok_s": tps, "peer": "HF generate", "peer_tok_s": hf[1], "ratio": tps / hf[1],
                     "roofline_frac": tps / roof_tps, "goal": ">= 80% of weight-read roofline (decode)",
                     "met": tps / roof_tps >= 0.8, "graphs": llm.runner.graphs is not None,
                     "sync_tok_s": sync_tps, "async_gain": tps / sync_tps,
                     "sync_decode_step_ms": sync_split["decode_step_ms"], **split,
                     "graph_step_ms": graph_step_ms(llm, 1, in_len + single_out // 2),
                     # decode steps alone (the goal's wording), and against the bytes a decode step must read:
                     # every weight but the embedding table, of which it reads one row per token
                     "decode_roofline_frac": 1e3 * weight_bytes / ceil["copy_bytes_per_s"] / split["decode_step_ms"],
                     "decode_read_roofline_frac": 1e3 * (weight_bytes - embed_bytes) / ceil["copy_bytes_per_s"]
                     / split["decode_step_ms"]})
        print(rows[-1], flush=True)
        if profile_dir is not None:
            for n in sizes.profiled(name):
                if n <= max(batches):
                    rows.append({"bench": f"profile {name}", **profile_decode(
                        llm, n, cfg.vocab_size, profile_dir, name, sizes.profile_in, sizes.profile_out)})
        del llm
        _empty_cache()
        for f in Path(tmp).iterdir():
            f.unlink()
    return rows


def _empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


TINY_LLAMA = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2)


@contextlib.contextmanager
def random_llama(tiny: bool, dtype: torch.dtype, device: str):
    """A random-weight Llama directory in a temporary folder (8B-shaped, or TINY_LLAMA), removed afterwards:
    yields (path, shape)."""
    from engine.core.testing.random_model import LLAMA_8B, write_random_llama

    shape = TINY_LLAMA if tiny else LLAMA_8B
    root = Path(tempfile.mkdtemp(prefix="engine_bench_"))
    try:
        yield write_random_llama(root / "model", **shape, max_position=4096, dtype=dtype, device=device), shape
    finally:
        shutil.rmtree(root, ignore_errors=True)


def emit_row(rows: list[dict], row: dict, out: Path | None, name: str) -> None:
    """Keep ``row``, print it, and append it to ``out/name.jsonl`` when ``out`` is given (a run stopped by a time
    limit keeps the rows it made)."""
    rows.append(row)
    print(row, flush=True)
    if out is not None:
        with open(out / f"{name}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def script_main(doc: str, run, extra=None) -> None:
    """The command line of a benchmarks/gpu script whose ``run(tiny=..., out=..., **more)`` takes ``--tiny`` and
    ``--out DIR`` (made if missing); ``extra(parser)`` adds options, passed on to ``run`` by name."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiny", action="store_true")
    if extra is not None:
        extra(ap)
    args = vars(ap.parse_args())
    out = args.pop("out")
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    run(out=Path(out) if out else None, **args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", action="append", help="sections: ceilings, engine, " + ", ".join(KERNEL_SECTIONS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true", help="also profile decode (8B: 1/64/256 requests; 1B: 64)")
    ap.add_argument("--tiny", action="store_true", help="every section at its tiny size (on the CPU without a GPU)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available() and not a.tiny:
        print("bench_gpu needs a CUDA GPU (or --tiny)", file=sys.stderr)
        return 2
    want = set(a.only or ("engine", *KERNEL_SECTIONS))
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (Triton interpreter)"
    result = {"device": device, "torch": torch.__version__, "date": time.strftime("%F"), "sections": {},
              "errors": {}}
    ceil = result["ceilings"] = ceilings(a.tiny)
    _empty_cache()
    print(f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 GEMM {ceil['bf16_flops'] / 1e12:.0f} TFLOP/s", flush=True)
    for name in KERNEL_SECTIONS:
        if name in want:
            _section(result, name, lambda name=name: importlib.import_module(f"benchmarks.gpu.{name}").run(tiny=a.tiny))
    if "engine" in want:
        _section(result, "engine", lambda: engine_section(ceil, a.quick, Path(a.out) if a.profile else None, a.tiny))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    table = _table(result)
    (out / "bench_gpu.md").write_text(table)
    print(table)
    return 0


def _section(result: dict, name: str, fn) -> None:
    t = time.perf_counter()
    try:
        result["sections"][name] = fn()
    except Exception:
        result["errors"][name] = traceback.format_exc()
        print(f"section {name} failed:\n{result['errors'][name]}", flush=True)
    print(f"section {name}: {time.perf_counter() - t:.0f} s", flush=True)


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _table(result: dict) -> str:
    lines = [f"{result['device']}, torch {result['torch']}, {result['date']}", ""]
    for name, rows in result["sections"].items():
        if not rows:
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        lines += [f"### {name}", "| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        lines += ["| " + " | ".join(_fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
        lines.append("")
    for name, err in result["errors"].items():
        lines.append(f"section {name} FAILED: {err.strip().splitlines()[-1]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
