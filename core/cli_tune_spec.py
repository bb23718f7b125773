"""``engine tune-spec``: measure speculative decoding on this machine and model, and print the
``num_speculative_tokens_per_batch_size`` table to pass to ``--speculative-config``.

For each batch size, every k of ``--ks`` (k = 0: no speculation) is timed on two workloads (spec_decode/tuning.py:
text the answer repeats, and free chat), interleaved, best of ``--repeats``; each batch size gets the k with the best
geometric-mean speedup among those no slower than ``--floor`` times k = 0 on either workload (0 where none is).
The method and its settings come from ``--speculative-config`` (default: n-gram lookup).
"""

from __future__ import annotations

import json
import sys
import time

from .cli_generate import add_model_arguments, load_llm


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--batch-sizes", type=_positive_ints, default=[1, 4, 16], metavar="N,N,...",
                   help="batch sizes to measure (comma-separated)")
    p.add_argument("--ks", type=_ks, default=[0, 1, 2, 4, 6], metavar="K,K,...",
                   help="draft tokens per step to try (comma-separated, 0..8; 0 is always measured)")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens generated per request")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per k (best kept)")
    p.add_argument("--floor", type=float, default=0.97,
                   help="a k slower than this times k = 0 on either workload is not chosen")
    p.add_argument("--out", help="also write the config, the table and every measurement to this JSON file")


def _int_list(text: str, lo: int, hi: int | None, need: str) -> list[int]:
    import argparse

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < lo or (hi is not None and max(values) > hi):
        raise argparse.ArgumentTypeError(f"need comma-separated integers {need}, got {text!r}")
    return values


def _positive_ints(text: str) -> list[int]:
    return _int_list(text, 1, None, ">= 1")


def _ks(text: str) -> list[int]:
    return _int_list(text, 0, 8, "in 0..8")


def run(args) -> int:
    from engine.core.engine.spec_decode.tuning import SpecTuner

    if args.max_tokens < 1 or args.repeats < 1:
        raise ValueError("--max-tokens and --repeats must be >= 1")
    base = dict(args.speculative_config or {"method": "ngram"})
    base.pop("num_speculative_tokens_per_batch_size", None)
    args.speculative_config = {**base, "num_speculative_tokens": 1}
    llm = load_llm(args, max_num_seqs=max(args.batch_sizes))
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    log(f"tune-spec: {llm.platform.device_name()}, {base.get('method', 'ngram')}, batch sizes "
        f"{args.batch_sizes}, k in {sorted(set(args.ks) | {0})}, {args.max_tokens} tokens, best of {args.repeats}")
    tuner = SpecTuner(llm, base, args.max_tokens, args.repeats, log=log)
    table, raw = tuner.tune(args.batch_sizes, args.ks, args.floor)
    config = {**base, "num_speculative_tokens_per_batch_size": {str(b): k for b, k in table.items()}}
    chosen = tuner.config(table)  # the engine's own lookup of the table
    print("batch | " + " | ".join(f"k={k}" for k in sorted(raw[min(raw)])) + " | chosen")
    for b, by_k in raw.items():
        cells = [" / ".join(f"{by_w[w] / by_k[0][w]:.2f}x" for w in by_w) for by_w in by_k.values()]
        print(f"{b} | " + " | ".join(cells) + f" | {chosen.num_tokens_for(b)}")
    print("(speedup against k=0 on " + " / ".join(next(iter(raw[min(raw)].values()))) + ")")
    print(f"--speculative-config '{json.dumps(config)}'")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"speculative_config": config, "device": llm.platform.device_name(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "max_tokens": args.max_tokens,
                       "tok_per_s": {str(b): {str(k): v for k, v in by_k.items()} for b, by_k in raw.items()}},
                      f, indent=1)
    return 0

