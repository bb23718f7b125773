"""Tensor parallelism on the CPU: the collectives against gloo, and TP=N decode against one rank, in the same run.

1. Collectives between two spawned processes: each registered kernel of all_reduce ([1, 576] fp32: a decode row of
   the built-in model), broadcast ([8] int64: a step's header; [301] int64: its ids, positions, slots and tables) and
   all_gather ([1, 24576] fp32: a rank's vocabulary slice of one row's logits) against torch.distributed over gloo
   (the op's reference), us per call, median of --iters.
2. ``LLM.generate`` on the built-in model (SmolLM2-135M Q4_1, fp32 compute), greedy, EOS ignored, best of --repeats
   after a warm-up: TP=1 eager (what TP=N runs: decode graphs are off under tensor parallelism), TP=1 with its decode
   graphs, and TP=N, at each batch size. On a 2-core VM two ranks share the cores, so this measures what the
   collectives cost, not a speed-up.

    python benchmarks/bench_cpu_tensor_parallel.py [--tp 2] [--batch-sizes 1 4] [--max-tokens 64] [--json F]
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_spec_decode import cpu_name  # noqa: E402

WORLD = 2
CALLS = (("all_reduce", (1, 576), torch.float32), ("broadcast", (8,), torch.int64),
         ("broadcast", (301,), torch.int64), ("all_gather", (1, 24576), torch.float32))


def _rank(rank: int, port: int, iters: int, results) -> None:
    from engine.core import plugins
    from engine.core.ops.registry import OPS

    torch.set_num_threads(1)  # as a tensor-parallel rank has its share of the cores (here: 2 ranks, 2 cores or more)
    registry = plugins.build_registry(plugins.activate("cpu"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for name, shape, dtype in CALLS:
            op = OPS[name]
            x = (torch.randn(shape) * 100).to(dtype)
            args = (x, 0) if name == "broadcast" else (x,)
            impls = [i for i in registry.implementations(op) if i.verdict(args) is None]
            for impl in [*impls[:1], op.reference_impl]:
                times = []
                for _ in range(iters + 3):
                    dist.barrier()
                    t0 = time.perf_counter()
                    impl.fn(*args)
                    times.append(time.perf_counter() - t0)
                if rank == 0:
                    results.put(dict(op=name, shape=list(shape), dtype=str(dtype).removeprefix("torch."),
                                     impl=impl.qualname, us=statistics.median(times[3:]) * 1e6))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collectives(iters: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(_rank, args=(_free_port(), iters, results), nprocs=WORLD, join=True)
    rows = []
    while not results.empty():
        rows.append(results.get())
    return rows


def decode_rate(tp: int, eager: bool, batch_sizes: list[int], max_tokens: int, repeats: int) -> dict[int, float]:
    from engine import LLM, SamplingParams

    llm = LLM(tensor_parallel_size=tp, enforce_eager=eager, max_num_seqs=max(batch_sizes))
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        rates = {}
        for b in batch_sizes:
            prompts = [f"Question {i}: name a colour and say why you like it." for i in range(b)]
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
            best = 0.0
            for _ in range(repeats):
                t0 = time.perf_counter()
                outs = llm.generate(prompts, sp)
                n = sum(len(o.outputs[0].token_ids) for o in outs)
                best = max(best, n / (time.perf_counter() - t0))
            rates[b] = best
        return rates
    finally:
        llm.close()


def run(tp: int = 2, batch_sizes=(1, 4), max_tokens: int = 64, repeats: int = 3, iters: int = 200,
        tiny: bool = False) -> dict:
    if tiny:
        batch_sizes, max_tokens, repeats, iters = [1], 4, 1, 5
    batch_sizes = list(batch_sizes)
    coll = collectives(iters)
    rates = {"tp1_eager": decode_rate(1, True, batch_sizes, max_tokens, repeats),
             "tp1_graphs": decode_rate(1, False, batch_sizes, max_tokens, repeats),
             f"tp{tp}": decode_rate(tp, True, batch_sizes, max_tokens, repeats)}
    return {"cpu": cpu_name(), "threads": torch.get_num_threads(), "tp": tp, "collectives": coll, "rates": rates,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def report(res: dict) -> str:
    lines = [f"CPU: {res['cpu']}; torch threads {res['threads']}; {res['date']}", "",
             "| collective | shape | dtype | kernel | us | reference (gloo) us | ratio |",
             "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    by_call: dict = {}
    for r in res["collectives"]:
        by_call.setdefault((r["op"], tuple(r["shape"]), r["dtype"]), []).append(r)
    for (op, shape, dtype), rows in by_call.items():
        ref = next(r for r in rows if r["impl"].endswith(".reference"))
        for r in rows:
            if r is not ref:
                lines.append(f"| {op} | {list(shape)} | {dtype} | {r['impl']} | {r['us']:.1f} | {ref['us']:.1f} | "
                             f"{ref['us'] / r['us']:.1f}x |")
        if len(rows) == 1:
            lines.append(f"| {op} | {list(shape)} | {dtype} | (reference only) | - | {ref['us']:.1f} | - |")
    tp = res["tp"]
    lines += ["", f"| batch | TP=1 eager tok/s | TP=1 graphs tok/s | TP={tp} tok/s | TP={tp} / TP=1 eager |",
              "| ---: | ---: | ---: | ---: | ---: |"]
    for b, eager in res["rates"]["tp1_eager"].items():
        tpn = res["rates"][f"tp{tp}"][b]
        lines.append(f"| {b} | {eager:.1f} | {res['rates']['tp1_graphs'][b]:.1f} | {tpn:.1f} | {tpn / eager:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=200, help="calls per collective timing")
    ap.add_argument("--tiny", action="store_true", help="a few tokens and calls (CI runs it: the numbers mean nothing)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = run(a.tp, a.batch_sizes, a.max_tokens, a.repeats, a.iters, a.tiny)
    print(report(res), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
