"""engine vs HF transformers on the built-in SmolLM2-135M-Instruct Q4_1 GGUF, in one run.

Measures, each configuration in its own subprocess (so one's threads never compete with another's):

- single: one 64-token chat prompt, 64 greedy output tokens (EOS ignored); tok/s = output tokens / wall time of
  the whole request (prefill included), plus the decode-only rate.
- batch: 16 random-token prompts x 64 in x 64 out, submitted together; output tok/s and (in+out) tok/s.

for engine (its GGUF kernels; fp32 or bf16 activations) and HF transformers (``from_pretrained(dir,
gguf_file=name)``, dequantised weights, fp32 and bf16, ``generate(do_sample=False)``). It also measures the peak
resident memory of ``engine generate`` and the KV-cache waste of a mixed-length workload (prompts of random
lengths 16..512, outputs 16..256). Prints a table with the ratios engine/HF; ``--json FILE`` saves everything.

    python benchmarks/bench_engine_vs_hf.py            # the full run (under ~10 minutes on 2 cores)
    python benchmarks/bench_engine_vs_hf.py --quick    # smaller shapes, a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

CHAT = ("Write a short story about a robot who learns to paint. Use five sentences, give it a happy ending and a "
        "small twist, and keep the language simple for children.")  # 64 tokens with SmolLM2's chat template


def _model_path() -> str:
    from engine.core.loader import default_model_path

    return default_model_path()


def _chat_ids() -> list[int]:
    from engine.core.loader import load_checkpoint

    tok = load_checkpoint(None).tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": CHAT}], add_generation_prompt=True),
                      add_special_tokens=False)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def engine_worker(a) -> dict:
    import torch

    from engine.core.cli_bench import random_prompts, run_workload
    from engine.core.engine.llm import LLM

    t = time.perf_counter()
    llm = LLM(dtype=a.dtype, enable_prefix_caching=False)  # a repeat must recompute its prompt, as HF does
    load = time.perf_counter() - t
    vocab = llm.config.vocab_size
    run_workload(llm, random_prompts(1, 8, vocab, a.seed + 99), [2])  # warm-up
    single = max((run_workload(llm, [a.chat_ids], [a.single_out], keep_tokens=True) for _ in range(a.repeat)),
                 key=lambda r: r["output_tok_per_s"])
    prompts = random_prompts(a.batch, a.batch_in, vocab, a.seed)
    batch = max((run_workload(llm, prompts, [a.batch_out] * a.batch) for _ in range(a.repeat)),
                key=lambda r: r["output_tok_per_s"])
    out = {"load_s": load, "threads": torch.get_num_threads(), "single_tok_per_s": single["output_tok_per_s"],
           "single_decode_tok_per_s": single["decode_tok_per_s"], "single_tokens": single["output_token_ids"][0],
           "batch_output_tok_per_s": batch["output_tok_per_s"], "batch_total_tok_per_s": batch["end_to_end_tok_per_s"],
           "batch_prefill_tok_per_s": batch["prefill_tok_per_s"], "batch_decode_tok_per_s": batch["decode_tok_per_s"],
           "batch_kv_waste_mean": batch["kv_waste_mean"]}
    if a.mixed:
        rng = random.Random(a.seed)
        lens = [rng.randint(16, 512) for _ in range(a.mixed)]
        outs = [rng.randint(16, 256) for _ in range(a.mixed)]
        m = run_workload(llm, random_prompts(a.mixed, lens, vocab, a.seed + 7), outs)
        out["mixed"] = {k: m[k] for k in ("num_requests", "prompt_tokens", "output_tokens", "wall_time_s",
                                          "num_steps", "num_preemptions", "kv_waste_mean", "kv_waste_max",
                                          "prefill_tok_per_s", "decode_tok_per_s", "output_tok_per_s")}
    out["peak_rss_mib"] = _peak_rss_mib()
    return out


def hf_worker(a) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = _model_path()
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=getattr(torch, a.dtype)).eval()
    load = time.perf_counter() - t
    vocab = model.config.vocab_size
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    def gen(ids: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
        with torch.inference_mode():
            t0 = time.perf_counter()
            # Equal-length prompts need no padding; the mask is all ones (left padding would be the layout).
            y = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=pad)
            return y[:, ids.shape[1]:], time.perf_counter() - t0

    g = torch.Generator().manual_seed(a.seed)
    gen(torch.randint(0, vocab, (1, 8), generator=g), 2)  # warm-up
    chat = torch.tensor([a.chat_ids])
    toks, t_single = gen(chat, a.single_out)
    t_single = min([t_single] + [gen(chat, a.single_out)[1] for _ in range(a.repeat - 1)])
    t_first = min(gen(chat, 1)[1] for _ in range(a.repeat))  # prefill + one token: decode-only is the rest
    from engine.core.cli_bench import random_prompts

    prompts = torch.tensor(random_prompts(a.batch, a.batch_in, vocab, a.seed))  # the engine's prompts
    t_batch = min(gen(prompts, a.batch_out)[1] for _ in range(a.repeat))
    n_out = a.batch * a.batch_out
    return {"load_s": load, "threads": torch.get_num_threads(), "single_tok_per_s": a.single_out / t_single,
            "single_decode_tok_per_s": (a.single_out - 1) / max(t_single - t_first, 1e-9),
            "single_tokens": toks[0].tolist(), "batch_output_tok_per_s": n_out / t_batch,
            "batch_total_tok_per_s": (n_out + a.batch * a.batch_in) / t_batch, "peak_rss_mib": _peak_rss_mib()}


def generate_peak_rss() -> dict:
    """Peak RSS of ``engine generate`` on the default model, through a fresh parent whose only child it is."""
    cmd = [sys.executable, "-m", "engine.core.cli", "generate", "--max-tokens", "32", "What is the capital of France?"]
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, check=True)
    rc, kib = out.stdout.split()
    if rc != "0":
        raise RuntimeError(f"engine generate failed (exit {rc})")
    return {"command": "engine generate --max-tokens 32 'What is the capital of France?'",
            "peak_rss_mib": int(kib) / 1024, "wall_s": time.perf_counter() - t}


def run_worker(kind: str, dtype: str, a, mixed: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--dtype", dtype, "--mixed", str(mixed),
           "--chat-ids", ",".join(map(str, a.chat_ids)),
           *(f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("batch", "batch_in", "batch_out", "single_out",
                                                                  "seed", "repeat"))]
    env = dict(os.environ)
    if a.threads:
        env.update(ENGINE_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} {dtype} failed:\n{proc.stderr[-3000:]}")
    print(f"  {kind:6} {dtype:8} done in {time.perf_counter() - t:5.1f} s", file=sys.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _agree(x: list[int], y: list[int]) -> int:
    return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))


def table(res: dict, a) -> str:
    rows = [("single: output tok/s (prefill incl.)", "single_tok_per_s"),
            ("single: decode-only tok/s", "single_decode_tok_per_s"),
            (f"batch {a.batch}x{a.batch_in}x{a.batch_out}: output tok/s", "batch_output_tok_per_s"),
            (f"batch {a.batch}x{a.batch_in}x{a.batch_out}: (in+out) tok/s", "batch_total_tok_per_s"),
            ("peak RSS of the worker (MiB)", "peak_rss_mib"), ("model load (s)", "load_s"),
            ("torch threads", "threads")]
    lines = []
    for dtype in a.dtypes:
        e, h = res[f"engine-{dtype}"], res[f"hf-{dtype}"]
        lines += [f"| {dtype} | engine | HF transformers | engine/HF |", "| --- | ---: | ---: | ---: |"]
        for label, key in rows:
            lines.append(f"| {label} | {e[key]:.1f} | {h[key]:.1f} | {e[key] / h[key]:.2f} |")
        lines.append(f"| greedy tokens agreeing (of {a.single_out}) | {_agree(e['single_tokens'], h['single_tokens'])}"
                     " | | |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["engine", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--chat-ids", help=argparse.SUPPRESS)  # the orchestrator tokenises the chat prompt once
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated; each runs engine and HF")
    p.add_argument("--single-out", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batch-in", type=int, default=64)
    p.add_argument("--batch-out", type=int, default=64)
    p.add_argument("--mixed", type=int, default=16, help="requests in the mixed-length KV-waste workload (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="threads for engine and HF (default: every CPU)")
    p.add_argument("--repeat", type=int, default=1, help="run single and batch this many times; keep the fastest")
    p.add_argument("--quick", action="store_true", help="4x16x8 batch, 16 single tokens, 4 mixed requests")
    p.add_argument("--json", help="also write all results to this file")
    a = p.parse_args(argv)
    if a.quick:
        a.single_out, a.batch, a.batch_in, a.batch_out, a.mixed = 16, 4, 16, 8, 4
    a.chat_ids = [int(t) for t in a.chat_ids.split(",")] if a.chat_ids else _chat_ids()
    if a.worker:
        print(json.dumps(engine_worker(a) if a.worker == "engine" else hf_worker(a)))
        return 0
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    t0 = time.perf_counter()
    res = {"date": time.strftime("%Y-%m-%d"), "chat_prompt_tokens": len(a.chat_ids), "args": {
        k: getattr(a, k) for k in ("single_out", "batch", "batch_in", "batch_out", "mixed", "seed", "dtypes",
                                   "threads", "repeat")}}
    res["engine_generate"] = generate_peak_rss()
    for i, dtype in enumerate(a.dtypes):
        res[f"engine-{dtype}"] = run_worker("engine", dtype, a, a.mixed if i == 0 else 0)
        res[f"hf-{dtype}"] = run_worker("hf", dtype, a)
    res["total_s"] = time.perf_counter() - t0
    print(f"\nsingle prompt: {len(a.chat_ids)}-token chat prompt, {a.single_out} greedy tokens\n")
    print(table(res, a))
    g = res["engine_generate"]
    print(f"peak RSS of `{g['command']}`: {g['peak_rss_mib']:.0f} MiB")
    mixed = res[f"engine-{a.dtypes[0]}"].get("mixed")
    if mixed:
        print(f"mixed workload ({mixed['num_requests']} requests, prompts 16..512, outputs 16..256, {a.dtypes[0]}): "
              f"KV waste {100 * mixed['kv_waste_mean']:.1f}% time-averaged, {100 * mixed['kv_waste_max']:.1f}% "
              f"worst; {mixed['num_steps']} steps, {mixed['num_preemptions']} preemptions, "
              f"{mixed['output_tok_per_s']:.1f} output tok/s")
    print(f"total {res['total_s']:.0f} s")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
