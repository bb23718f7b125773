"""The ``engine`` command line: ``engine generate``, ``engine bench``, ``engine doctor``."""

from __future__ import annotations

import argparse
import os
import sys


def _doctor(args) -> int:
    from .doctor import main

    return main(args.platform or os.environ.get("ENGINE_PLATFORM") or None, args.json)


def _generate(args) -> int:
    from .cli_generate import run

    return run(args)


def _bench(args) -> int:
    from .cli_bench import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from . import cli_bench, cli_generate

    parser = argparse.ArgumentParser(prog="engine", description="A portable LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete prompts with a model (default: the built-in SmolLM2)")
    cli_generate.add_arguments(gen)
    gen.set_defaults(func=_generate)
    bench = sub.add_parser("bench", help="synthetic workload: throughput, latency percentiles, KV waste, kernels")
    cli_bench.add_arguments(bench)
    bench.set_defaults(func=_bench)
    doctor = sub.add_parser("doctor", help="show every platform plugin, the selected one, and each op's kernel")
    doctor.add_argument("--platform", help="force a platform (same as ENGINE_PLATFORM)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        # Bad input (model file, platform, sampling parameters, prompt length): one clear line, no traceback.
        # ENGINE_DEBUG=1 shows the traceback.
        if os.environ.get("ENGINE_DEBUG"):
            raise
        print(f"engine {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
