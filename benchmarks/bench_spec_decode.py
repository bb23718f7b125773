"""Speculative decoding: tok/s with k draft tokens against k = 0 (no speculation), same engine, same run.

The workloads and the measurement are ``engine tune-spec``'s (core/engine/spec_decode/tuning.py: ``repetitive``,
text the answer repeats, n-gram lookup's case; ``chat``, free questions), on the built-in default model
(SmolLM2-135M-Instruct Q4_1), greedy, EOS honoured; this script adds the report below.

For each batch size B (B prompts of the workload, cycled, generated together) and each k in --ks, one
``LLM.generate`` is timed (best of --repeats, after a warm-up; prefix caching on, so repeats skip the prompt's
prefill for every k alike). The table ``num_speculative_tokens_per_batch_size`` is then filled (spec_decode/
tuning.py: per B the k with the best geometric-mean speedup over the workloads, among those no slower than
--floor on any; else 0) and the engine is run once more with that table, reporting per B and workload the speedup
against k = 0, the acceptance rate and the k chosen.

    python benchmarks/bench_spec_decode.py                          # n-gram, B in 1 4 16, k in 0 1 2 4 6
    python benchmarks/bench_spec_decode.py --batch-sizes 1 --ks 0 4 --max-tokens 64 --json table.json
    python benchmarks/bench_spec_decode.py --method draft_model --dequantize-target   # Q4_1 draft, fp32 target
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"unknown CPU ({exc})"
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=("ngram", "draft_model"), default="ngram")
    ap.add_argument("--draft-model", default=None, help="draft checkpoint (default: the built-in model)")
    ap.add_argument("--dequantize-target", action="store_true", help="target weights dequantized to fp32")
    ap.add_argument("--activation-quant", choices=("none", "q8", "auto"), default="none",
                    help="the target's activation_quant (q8: int8 dot products for GGUF Q4/Q8 weights)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 6])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU time (with --threads 1, robust to other jobs on a busy host)")
    ap.add_argument("--floor", type=float, default=0.97)
    ap.add_argument("--lookup-min", type=int, default=3)
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--json", default=None, help="write the table and all measurements here")
    a = ap.parse_args(argv)

    import torch

    from engine import LLM
    from engine.core.engine.spec_decode.tuning import WORKLOADS, SpecTuner

    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"CPU: {cpu_name()}; torch threads {torch.get_num_threads()}; method {a.method}; activation_quant "
          f"{a.activation_quant}; max_tokens {a.max_tokens}; {a.clock} clock; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    spec_base = {"method": a.method, "prompt_lookup_min": a.lookup_min, "prompt_lookup_max": a.lookup_max}
    if a.method == "draft_model":
        spec_base = {"method": a.method, "model": a.draft_model, "dequantize": False}
    llm = LLM(dequantize=a.dequantize_target, max_num_seqs=max(a.batch_sizes), activation_quant=a.activation_quant,
              speculative_config={**spec_base, "num_speculative_tokens": 1})
    b = SpecTuner(llm, spec_base, a.max_tokens, a.repeats, time.process_time if a.clock == "cpu" else time.perf_counter)
    table, raw = b.tune(a.batch_sizes, a.ks, a.floor)
    print(f"\nnum_speculative_tokens_per_batch_size = {table}\n")
    rows = []
    print("| batch | workload | k=0 tok/s | table tok/s | speedup | k chosen | acceptance | tokens/step |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for bs in a.batch_sizes:
        for w in WORKLOADS:
            base = rate = 0.0
            b.set_table(table)
            spec = llm.engine.speculator
            for _ in range(a.repeats):  # interleaved, best of each
                llm.engine.speculator = None
                base = max(base, b.run(bs, w)[0])
                llm.engine.speculator = spec
                rate = max(rate, b.run(bs, w)[0])
            st = spec.stats if spec else None
            t = st.totals() if st else {}
            ks = sorted({d["k"] for d in st.by_batch_size.values()}) if st else [0]
            acc = f"{st.acceptance_rate:.2f}" if st and t.get("drafted") else "-"
            per_step = f"{t['emitted'] / t['steps'] / bs:.2f}" if t.get("steps") else "1.00"
            rows.append(dict(batch=bs, workload=w, base=base, table=rate, k=ks, acceptance=acc))
            print(f"| {bs} | {w} | {base:.1f} | {rate:.1f} | {rate / base:.2f}x | {'/'.join(map(str, ks))} | "
                  f"{acc} | {per_step} |", flush=True)
    print("\nall k (tok/s; speedup against k=0):")
    for bs, by_k in raw.items():
        for k, by_w in by_k.items():
            print(f"  B={bs:<3} k={k}: " + ", ".join(f"{w} {r:.1f} ({r / raw[bs][0][w]:.2f}x)"
                                                     for w, r in by_w.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_name(), "table": table, "raw": raw, "final": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
