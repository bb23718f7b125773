"""The ``engine`` command line: ``engine generate``, ``engine bench``, ``engine tune-spec``, ``engine serve``,
``engine doctor``."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys


def _doctor(args) -> int:
    from .doctor import main

    resume_gc()
    return main(args.platform or os.environ.get("ENGINE_PLATFORM") or None, args.json, args.model, args.dtype)


def _generate(args) -> int:
    from .cli_generate import run

    return run(args)


def _bench(args) -> int:
    from .cli_bench import run

    return run(args)


def _tune_spec(args) -> int:
    from .cli_tune_spec import run

    return run(args)


def _serve(args) -> int:
    from .cli_serve import run

    resume_gc()
    return run(args)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit status 2, as every user error) instead of usage plus error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show (None, off, an empty list) or the
    help already says it."""

    def _get_help_string(self, action):
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from engine import __version__

    from . import cli_bench, cli_generate, cli_serve, cli_tune_spec

    parser = _Parser(prog="engine", description="A portable LLM inference engine.",
                     formatter_class=_DefaultsFormatter)
    parser.add_argument("--version", action="version", version=f"engine {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete prompts with a model (default: the built-in SmolLM2)")
    cli_generate.add_arguments(gen)
    gen.set_defaults(func=_generate)
    bench = sub.add_parser("bench", help="synthetic workload: throughput, latency percentiles, KV waste, kernels")
    cli_bench.add_arguments(bench)
    bench.set_defaults(func=_bench)
    tune = sub.add_parser("tune-spec", help="measure speculative decoding here and print the k table for "
                                            "--speculative-config")
    cli_tune_spec.add_arguments(tune)
    tune.set_defaults(func=_tune_spec)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the serve extra)")
    cli_serve.add_arguments(serve)
    serve.set_defaults(func=_serve)
    doctor = sub.add_parser("doctor", help="show every platform plugin, the selected one, and each op's kernel")
    doctor.add_argument("--platform", help="force a platform (same as ENGINE_PLATFORM)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--model", help="also load this checkpoint on the host (a *.gguf file or an HF directory; "
                                        "'default': the built-in model) and say what stays quantized and the memory")
    doctor.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"),
                        help="the activation dtype the model is described for (with --model)")
    doctor.set_defaults(func=_doctor)
    for p in sub.choices.values():  # every subcommand's --help shows its defaults
        p.formatter_class = _DefaultsFormatter
    return parser


# Errors a user can fix (a model path, a platform, a setting): one line on stderr and USER_ERROR, no traceback.
USER_ERRORS = (ValueError, TypeError, OSError, RuntimeError)
USER_ERROR = 2
INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a process ended by Ctrl-C
BROKEN_PIPE = 128 + getattr(signal, "SIGPIPE", 13)  # 141, as a shell reports `yes | head`


_GC_PAUSED: list[bool] = []  # [True] while main() holds the collector off during start-up


def resume_gc() -> None:
    """End start-up: the objects alive now (imported modules, the loaded model) move to the collector's permanent
    generation and collection resumes. A no-op unless main() paused it."""
    if _GC_PAUSED:
        _GC_PAUSED.clear()
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status: 0, USER_ERROR (bad input, one line on stderr; ENGINE_DEBUG=1
    shows the traceback), INTERRUPTED (Ctrl-C, quietly) or BROKEN_PIPE (the reader of stdout went away).

    A command-line run (``argv`` None) starts up (imports, the model load) without the cyclic garbage collector:
    start-up makes next to no garbage cycles, but the collections its allocations trigger walk torch's ~10^5
    objects, ~0.2 s in all. Each command calls resume_gc() once its model is loaded (or before it starts, where it
    loads none). In-process callers (tests, an embedding program) keep their collector as it is: freezing their
    objects could keep their uncollected garbage alive for good."""
    command = "engine"
    if argv is None and gc.isenabled() and not _GC_PAUSED:
        gc.disable()
        _GC_PAUSED.append(True)
    try:
        args = build_parser().parse_args(argv)
        command = f"engine {args.command}"
        if argv is None:
            _show_engine_log()
        return args.func(args)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during shutdown must not print either
        return INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    except USER_ERRORS as exc:
        if os.environ.get("ENGINE_DEBUG"):
            raise
        print(f"{command}: error: {exc}", file=sys.stderr)
        return USER_ERROR
    finally:
        resume_gc()


def _show_engine_log() -> None:
    """The engine's own log lines on stderr for a command-line run: what a load kept quantized or expanded and the
    memory, whose sampling defaults apply (INFO); ENGINE_LOG_LEVEL=WARNING keeps only warnings."""
    import logging

    logger = logging.getLogger("engine")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        level = os.environ.get("ENGINE_LOG_LEVEL", "INFO").upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"ENGINE_LOG_LEVEL={level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
        logger.setLevel(level)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (embedded, replaced by a test): nothing will be flushed to it
        pass


if __name__ == "__main__":
    sys.exit(main())
