"""The ``engine`` command line: ``engine doctor`` (``generate`` and ``bench`` come with the engine core)."""

from __future__ import annotations

import argparse
import os
import sys


def _doctor(args) -> int:
    from .doctor import main

    return main(args.platform or os.environ.get("ENGINE_PLATFORM") or None, args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine", description="A portable LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="show every platform plugin, the selected one, and each op's kernel")
    doctor.add_argument("--platform", help="force a platform (same as ENGINE_PLATFORM)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
