"""Quantized MoE experts on the cpu platform: ``fused_moe_gguf`` (experts kept as GGUF blocks, what GGUF and GPTQ/AWQ
MoE models run) against the native dense ``fused_moe`` on the same experts decoded to bf16 and fp32, in one run.

Default shape: Qwen3-30B-A3B's experts scaled to 32 of them (hidden 2048, intermediate 768, top-8), T = 1, 16, 64
tokens, Q4_0 and Q8_0 gate/up with the same type for down. Prints the median ms per call of each and dense/quantized
(> 1: the quantized experts are faster), plus the bytes of expert weights each reads per call at T = 1 (a decode step
touches top-k experts). Every result is first checked against the op's reference. Run:
``python benchmarks/bench_cpu_moe_quant.py [--threads N] [--tokens 1 16 64] [--qtypes Q4_0 Q8_0] [--json]``.
"""

from __future__ import annotations

import argparse
import json

import torch
from cpu_timing import median_seconds

from engine.core.ops.gguf_quant import Q4_0, Q4_1, Q8_0
from engine.core.ops.moe import distinct_logits, fused_moe
from engine.core.ops.moe_gguf import dequantize_experts, fused_moe_gguf, random_experts
from engine.core.ops.registry import active_registry
from engine.platforms.cpu import _native

QTYPES = {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q8_0": Q8_0}


def run(tiny: bool = False, tokens=(1, 16, 64), qtypes=("Q4_0", "Q8_0"), experts: int = 32, top_k: int = 8,
        hidden: int = 2048, inter: int = 768, min_time: float = 1.0) -> list[dict]:
    """One row per (qtype, T): ms of the quantized op and of the dense op in bf16 and fp32, and their ratios."""
    if tiny:
        tokens, experts, top_k, hidden, inter, min_time = (1, 5), 4, 2, 64, 64, 0.01
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in qtypes:
        qtype = QTYPES[name]
        w13 = random_experts(experts, 2 * inter, hidden, qtype, "cpu", gen)
        w2 = random_experts(experts, hidden, inter, qtype, "cpu", gen)
        dense = {dt: (dequantize_experts(w13, qtype, hidden).to(dt), dequantize_experts(w2, qtype, inter).to(dt))
                 for dt in (torch.bfloat16, torch.float32)}
        for t in tokens:
            row = {"qtype": name, "tokens": t}
            for dt, label in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
                x = torch.randn(t, hidden, generator=gen).to(dt)
                logits = distinct_logits(t, experts, dt, "cpu", gen)
                q_args = (x, w13, qtype, w2, qtype, logits, top_k, True)
                d_args = (x, *dense[dt], logits, top_k, True)
                for op, args in ((fused_moe_gguf, q_args), (fused_moe, d_args)):
                    impl = active_registry().select(op, args)
                    assert impl.platform == "cpu" and impl.name != "reference", f"dispatch chose {impl.qualname}"
                    tol = op.tolerances[dt]
                    torch.testing.assert_close(op(*args), op.reference(*args), atol=tol.atol, rtol=tol.rtol)
                q_ms = 1e3 * median_seconds(lambda a=q_args: fused_moe_gguf(*a), warmup=2, min_time=min_time)
                d_ms = 1e3 * median_seconds(lambda a=d_args: fused_moe(*a), warmup=2, min_time=min_time)
                row.update({f"quant_{label}_ms": q_ms, f"dense_{label}_ms": d_ms,
                            f"dense_over_quant_{label}": d_ms / q_ms})
            row["quant_bytes_per_expert"] = (w13.nbytes + w2.nbytes) // experts
            row["bf16_bytes_per_expert"] = sum(w.nbytes for w in dense[torch.bfloat16]) // experts
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="threads for both (default: the native pool's)")
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--qtypes", nargs="+", choices=sorted(QTYPES), default=["Q4_0", "Q8_0"])
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    threads = args.threads or _native.num_threads()
    _native.set_num_threads(threads)
    torch.set_num_threads(threads)
    rows = run(tokens=args.tokens, qtypes=args.qtypes, experts=args.experts, top_k=args.top_k, hidden=args.hidden,
               inter=args.inter)
    if args.json:
        print(json.dumps({"isa": _native.isa(), "threads": threads, "results": rows}, indent=1))
        return
    print(f"quantized MoE experts: {args.experts} experts, top-{args.top_k}, hidden {args.hidden}, intermediate "
          f"{args.inter}; native isa={_native.isa()}, {threads} threads")
    print(f"{'type':>5} {'T':>4} | {'gguf bf16 ms':>12} {'dense bf16 ms':>13} {'dense/gguf':>10} | "
          f"{'gguf fp32 ms':>12} {'dense fp32 ms':>13} {'dense/gguf':>10}")
    for r in rows:
        print(f"{r['qtype']:>5} {r['tokens']:>4} | {r['quant_bf16_ms']:>12.2f} {r['dense_bf16_ms']:>13.2f} "
              f"{r['dense_over_quant_bf16']:>10.2f} | {r['quant_fp32_ms']:>12.2f} {r['dense_fp32_ms']:>13.2f} "
              f"{r['dense_over_quant_fp32']:>10.2f}")


if __name__ == "__main__":
    main()
