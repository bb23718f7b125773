"""Run a CPU benchmark script against two builds of the native module, alternately, in one run.

For before/after comparisons of a kernel change (BENCHMARKS.md): build the 'before' extension from
``git show HEAD:`` sources (or copy the installed ``_native*.so`` before rebuilding), then
``python benchmarks/bench_cpu_ab.py BEFORE.so AFTER.so [--rounds N] -- benchmarks/bench_cpu_attention.py ARGS``.
Each round runs the script once per build in a fresh process (A, B, A, B, ...), so that load from
other processes hits both alike; compare the medians of the printed rows across rounds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

# Loads the given .so as engine.platforms.cpu._native before the benchmark imports it.
_PRELOAD = """
import importlib.util, os, runpy, sys
import engine.platforms.cpu as pkg
spec = importlib.util.spec_from_file_location("engine.platforms.cpu._native", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.modules["engine.platforms.cpu._native"] = mod
pkg._native = mod
script = sys.argv[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script` would: its sibling modules
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv[:split])
    script = argv[split + 1:]
    for r in range(args.rounds):
        for label, so in (("before", args.before), ("after", args.after)):
            print(f"=== round {r + 1} {label}: {so}", flush=True)
            subprocess.run([sys.executable, "-c", _PRELOAD, so, *script], check=True)


if __name__ == "__main__":
    main()
