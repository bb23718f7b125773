"""Where a many-request decode step's time goes on the cpu platform, against the machine's ceilings in the same run.

The 32-request row of bench_cpu_vs_llamacpp.py is one number; this says what bounds it. The built-in model serves
``--requests`` prompts of ``--in-min``..``--in-max`` random tokens for ``--out`` greedy tokens (EOS ignored), twice:
with one output token (the prefill alone) and with ``--out``; the difference over ``--out - 1`` is the decode step.
Every call of a native kernel is timed (the CPU decode graphs are captured through the timers) and added to its
family. Printed per decode step: each family's ms and share, then

* the linears' fp32 GFLOP/s (2 x weights x requests) against numpy's OpenBLAS fp32 GEMM on a 2048^3 product, the
  same threads, in a child process on the same ISA (OpenBLAS's own AVX-512 kernel, or ``OPENBLAS_CORETYPE=Haswell``
  for AVX2): the FMA rate a tuned GEMM reaches here (torch's fp32 GEMM reached half of it on AMD);
* the attention's KV bytes read per second against a streaming read of as many bytes (torch ``sum``).

    python benchmarks/bench_cpu_step_profile.py [--isa avx2] [--activation-quant q8] [--requests 32] [--out 64]

The timers add ~1 us a call (a step has ~300), so shares of small ops are upper bounds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

from bench_cpu_vs_llamacpp import ONEDNN_ISA_CAP  # a forced ISA caps torch's oneDNN GEMMs too

FAMILIES = (("linear", ("gguf_linear", "fp16_linear", "linear")), ("attention", ("paged_attention",)),
            ("kv write", ("write_kv_cache", "rotary_write_kv")), ("norm", ("rms_norm", "fused_add_rms_norm")),
            ("activation", ("silu_and_mul", "gelu")), ("rotary", ("rotary",)), ("embedding", ("embedding",)))
# OpenBLAS's kernel for each ISA (its own detection picks AVX-512 where the CPU has it; "Haswell" is its AVX2 one).
OPENBLAS_CORE = {"avx512": None, "avx2": "Haswell"}


def family(name: str) -> str:
    return next((f for f, prefixes in FAMILIES if name.startswith(prefixes)), "other native")


def gemm_ceiling() -> float:
    """GFLOP/s of numpy's (OpenBLAS) fp32 2048^3 GEMM, best of 10; the child's environment picks its kernel."""
    import numpy as np

    a, b = np.random.rand(2048, 2048).astype(np.float32), np.random.rand(2048, 2048).astype(np.float32)
    for _ in range(3):
        a @ b
    return 2 * 2048 ** 3 / min(_timed(lambda: a @ b) for _ in range(10)) / 1e9


def stream_read(nbytes: int, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(max(nbytes, 64 << 20) // 4)
    x.sum()
    best = min(_timed(x.sum) for _ in range(7))
    return x.numel() * 4 / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def linear_flops_per_token(cfg) -> int:
    """2 x the weights a decoded token multiplies: q/k/v/o, the gated MLP and the LM head (dense Llama-style)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attn = h * d * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    return 2 * (cfg.num_layers * (attn + 3 * h * cfg.intermediate_size) + cfg.vocab_size * h)


def profile(args) -> dict:
    import torch

    from engine.platforms.cpu import _native

    if args.isa:
        _native.set_isa(args.isa)
    if args.threads:
        _native.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    spent: dict = collections.defaultdict(float)

    def timed(name, fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[family(name)] += time.perf_counter() - t
        return call

    for name in dir(_native):  # before the LLM exists: its decode graphs record the timed functions
        fn = getattr(_native, name)
        if callable(fn) and not name.startswith("_") and family(name) != "other native":
            setattr(_native, name, timed(name, fn))
    from engine import LLM, SamplingParams

    llm = LLM(dtype="float32", enable_prefix_caching=False, activation_quant=args.activation_quant)
    gen = torch.Generator().manual_seed(args.seed)
    lens = torch.randint(args.in_min, args.in_max + 1, (args.requests,), generator=gen)
    prompts = [torch.randint(100, llm.model.cfg.vocab_size - 100, (int(n),), generator=gen).tolist() for n in lens]

    def run(out: int) -> tuple[float, dict]:
        spent.clear()
        t = time.perf_counter()
        llm.generate(prompts, SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True))
        return time.perf_counter() - t, dict(spent)

    run(min(8, args.out))  # captures the decode graphs, warms the caches
    (w1, s1), (wn, sn) = run(1), run(args.out)
    steps = args.out - 1
    step = {f: (sn.get(f, 0.0) - s1.get(f, 0.0)) / steps for f in set(sn) | set(s1)}
    step_wall = (wn - w1) / steps
    step["host and torch (untimed)"] = step_wall - sum(step.values())
    cfg = llm.model.cfg
    mean_ctx = float(lens.float().mean()) + args.out / 2
    kv_bytes = 2 * cfg.num_layers * args.requests * mean_ctx * cfg.num_kv_heads * cfg.head_dim * 4
    return {"isa": _native.isa(), "threads": _native.num_threads(), "step_ms": step_wall * 1e3,
            "families_ms": {f: v * 1e3 for f, v in step.items()}, "prefill_s": w1,
            "linear_gflops": linear_flops_per_token(cfg) * args.requests / step["linear"] / 1e9,
            "kv_bytes": kv_bytes, "attention_gbps": kv_bytes / step.get("attention", float("nan")) / 1e9,
            "tok_per_s": args.requests * args.out / wn}


def child(what: str, isa: str, threads: int, nbytes: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    if OPENBLAS_CORE.get(isa):
        env["OPENBLAS_CORETYPE"] = OPENBLAS_CORE[isa]
    arg = "gemm_ceiling()" if what == "gemm" else f"stream_read({nbytes}, {threads})"
    code = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); " \
           f"import bench_cpu_step_profile as b; print(b.{arg})"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isa", default=None, help="force the native ISA (avx512, avx2, scalar); default: the best")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: all)")
    ap.add_argument("--activation-quant", default="none", choices=("none", "q8"))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--in-min", type=int, default=32)
    ap.add_argument("--in-max", type=int, default=64)
    ap.add_argument("--out", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.out < 2:
        ap.error("--out must be at least 2 (the decode step is the difference of two runs)")
    if args.isa in ONEDNN_ISA_CAP:  # read when torch first uses oneDNN: cap its GEMMs to the forced ISA too
        os.environ["ONEDNN_MAX_CPU_ISA"] = ONEDNN_ISA_CAP[args.isa]
    res = profile(args)
    res["gemm_ceiling_gflops"] = child("gemm", res["isa"], res["threads"], 0) if res["isa"] in OPENBLAS_CORE \
        else float("nan")
    res["stream_gbps"] = child("stream", res["isa"], res["threads"], int(res["kv_bytes"])) / 1e9
    print(f"cpu platform, ISA {res['isa']}, {res['threads']} threads, activation_quant={args.activation_quant}: "
          f"{args.requests} requests x {args.out} tokens, {res['tok_per_s']:.1f} tok/s end to end, prefill "
          f"{res['prefill_s']:.2f} s; decode step {res['step_ms']:.2f} ms")
    for f, ms in sorted(res["families_ms"].items(), key=lambda kv: -kv[1]):
        print(f"  {f:26s} {ms:7.2f} ms  {100 * ms / res['step_ms']:5.1f}%")
    ceiling, stream = res["gemm_ceiling_gflops"], res["stream_gbps"]
    print(f"  linears: {res['linear_gflops']:.0f} GFLOP/s = {100 * res['linear_gflops'] / ceiling:.0f}% "
          f"of OpenBLAS's fp32 GEMM ({ceiling:.0f} GFLOP/s at 2048^3, same ISA and threads)")
    print(f"  attention: {res['kv_bytes'] / 1e6:.0f} MB of KV a step at {res['attention_gbps']:.1f} GB/s = "
          f"{100 * res['attention_gbps'] / stream:.0f}% of a streaming read ({stream:.1f} GB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
