"""The CI hardware matrix: which tests form each cell, where each cell runs, and the end-of-run report.

Every test gets markers from where it lives (the hooks below): ``tests/platforms/<name>/`` -> ``<name>`` (cpu, cuda,
triton_kernels, ...), ``tests/csrc`` -> ``csrc`` and ``csrc_<target>`` per cross target, ``tests/conformance`` ->
``conformance``, everything else -> ``core``; the CPU kernel tests' ISA parameters carry ``isa`` and ``isa_<name>``
(tests/isa_paths.py). A cell is a ``pytest -m`` expression over those markers plus the CI rows (ROWS, one per
machine kind, the jobs of .github/workflows/ci.yml) that run it. At the end of a run the report prints each cell as
passed, FAILED, or NOT RUN with the reason (the skip reasons, no tests collected, or the rows that run it), so a
green run never passes a cell silently. A new cell is one line in CELLS; a new row one line in ROWS and one in
ci.yml (tests/test_ci_matrix.py checks the two agree).

The report is printed when the run is the whole suite (no paths given), under CI, when ENGINE_CI_ROW names the
row (the self-hosted jobs set it), or with ``--ci-matrix=yes``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.isa_paths import PATHS, SCALAR


@dataclass(frozen=True)
class Row:
    name: str
    runner: str       # the job's runs-on labels
    runs: str         # what the job runs


@dataclass(frozen=True)
class Cell:
    name: str
    markexpr: str     # the tests it holds, as a `pytest -m` expression
    rows: tuple[str, ...]


ROWS = {r.name: r for r in (
    Row("x86-64", "ubuntu-24.04", ".ci/run (the README's test command, after the apt toolchains)"),
    Row("aarch64", "ubuntu-24.04-arm", "kit --engine-platform=cpu; -m 'cpu or csrc_host'"),
    Row("nvidia-hopper", "self-hosted, linux, x64, nvidia-hopper", ".ci/run-gpu (kit --engine-platform=cuda + tests)"),
    Row("nvidia-blackwell", "self-hosted, linux, x64, nvidia-blackwell", ".ci/run-gpu"),
    Row("amd-mi300", "self-hosted, linux, x64, amd-mi300", "kit --engine-platform=rocm; -m 'rocm or triton_kernels'"),
    Row("intel-gpu", "self-hosted, linux, x64, intel-gpu", "kit --engine-platform=xpu; -m 'xpu or triton_kernels'"),
    Row("riscv64", "self-hosted, linux, riscv64", "kit --engine-platform=riscv; -m 'cpu or riscv or csrc_host'"),
    Row("ppc64le", "self-hosted, linux, ppc64le", "kit --engine-platform=ppc; -m 'cpu or ppc or csrc_host'"),
)}
_GPUS = ("nvidia-hopper", "nvidia-blackwell")
CELLS = (
    Cell("core: engine, models, loader, CLI, plugins", "core", ("x86-64",)),
    Cell("conformance kit: the selected platform", "conformance", ("x86-64",)),
    Cell("cpu platform: ISA-independent tests", "cpu and not isa", ("x86-64", "aarch64", "riscv64", "ppc64le")),
    Cell("cpu kernels: avx512", "cpu and isa_avx512", ("x86-64",)),
    Cell("cpu kernels: avx2", "cpu and isa_avx2", ("x86-64",)),
    Cell("cpu kernels: scalar", "cpu and isa_scalar", ("x86-64", "aarch64", "riscv64", "ppc64le")),
    Cell("cpu kernels: neon", "cpu and isa_neon", ("aarch64",)),
    Cell("cpu kernels: rvv", "cpu and isa_rvv", ("riscv64",)),
    Cell("cpu kernels: vsx", "cpu and isa_vsx", ("ppc64le",)),
    Cell("cpu path: avx512_vnni (Q8-activation GEMV)", "isa_avx512_vnni", ("x86-64",)),
    Cell("cpu path: amx_bf16 (bf16 MoE prefill)", "isa_amx_bf16", ("x86-64",)),
    Cell("cpu path: neon_dotprod (Q8-activation GEMV)", "isa_neon_dotprod", ("aarch64",)),
    Cell("C++ kernel tests: host", "csrc_host", ("x86-64", "aarch64", "riscv64", "ppc64le")),
    Cell("C++ kernel tests: aarch64 under qemu-user", "csrc_aarch64", ("x86-64",)),
    Cell("C++ kernel tests: ppc64le under qemu-user", "csrc_ppc64le", ("x86-64",)),
    Cell("C++ kernel tests: riscv64 under qemu-user", "csrc_riscv64", ("x86-64",)),
    Cell("Triton kernels (interpreter on CPU, native on GPU)", "triton_kernels",
         ("x86-64", *_GPUS, "amd-mi300", "intel-gpu")),
    Cell("cuda platform", "cuda", _GPUS),
    Cell("rocm platform", "rocm", ("amd-mi300",)),
    Cell("xpu platform", "xpu", ("intel-gpu",)),
    Cell("riscv platform", "riscv", ("riscv64",)),
    Cell("ppc platform", "ppc", ("ppc64le",)),
)
_MACHINE_ROW = {"x86_64": "x86-64", "aarch64": "aarch64", "riscv64": "riscv64", "ppc64le": "ppc64le"}
PLATFORM_MARKERS = ("cpu", "cuda", "rocm", "xpu", "riscv", "ppc", "triton_kernels")


def path_markers(rel: tuple[str, ...], params: dict) -> list[str]:
    """The markers a test gets from its path under tests/ (as parts) and its parameters."""
    if len(rel) > 2 and rel[0] == "platforms":
        return [rel[1]]
    if rel and rel[0] == "csrc":
        target = params.get("target")
        return ["csrc"] + (["csrc_" + re.sub(r"\W", "_", str(target))] if target is not None else [])
    if rel and rel[0] == "conformance":
        return ["conformance"]
    return ["core"]


def matches(markexpr: str, marks: set[str]) -> bool:
    return Expression.compile(markexpr).evaluate(lambda name, **kwargs: name in marks)


@dataclass
class Tally:
    outcome: Counter = field(default_factory=Counter)
    skips: Counter = field(default_factory=Counter)
    collected: int = 0


def cell_status(cell: Cell, tally: Tally, row: str | None) -> tuple[str, str]:
    """(status, detail) of one cell: FAILED beats passed beats NOT RUN; a NOT RUN says why."""
    o = tally.outcome
    counts = ", ".join(f"{o[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed") if o[k])
    if o["failed"] or o["error"]:
        return "FAILED", counts
    if o["passed"]:
        top = tally.skips.most_common(1)
        return "passed", counts + (f" (skipped: {top[0][0]})" if top else "")
    elsewhere = [r for r in cell.rows if r != row]
    where = f"; runs on {', '.join(elsewhere)}" if elsewhere and row not in cell.rows else ""
    if tally.collected == 0:
        return "NOT RUN", f"no tests selected in this run{where}"
    if not tally.skips:
        return "NOT RUN", f"{tally.collected} collected, none ran{where}"
    reasons = "; ".join(f"{r} [{n}]" for r, n in tally.skips.most_common(2))
    more = f"; +{len(tally.skips) - 2} more reasons" if len(tally.skips) > 2 else ""
    return "NOT RUN", f"{reasons}{more}{where}"


def report_lines(tallies: dict[str, Tally], unassigned: list[str], row: str | None) -> list[str]:
    """The matrix as text: one line per cell, then the tests in no cell, then the rows."""
    lines = []
    width = max(len(c.name) for c in CELLS)
    for cell in CELLS:
        status, detail = cell_status(cell, tallies[cell.name], row)
        lines.append(f"{status:8} {cell.name:{width}}  {detail}")
    if unassigned:
        lines.append(f"NO CELL  {len(unassigned)} tests are in no cell (add one to tests/ci_matrix.py CELLS), "
                     f"e.g. {unassigned[0]}")
    lines.append(f"rows (.github/workflows/ci.yml){'' if row else '; this host is no known row'}:")
    for r in ROWS.values():
        here = "this run" if r.name == row else "NOT RUN here"
        lines.append(f"  {here:12} {r.name:17} runs-on [{r.runner}]: {r.runs}")
    return lines


# ---- the pytest plugin (its hooks are imported into tests/conftest.py) ----

def pytest_addoption(parser):
    parser.addoption("--ci-matrix", choices=("auto", "yes", "no"), default="auto",
                     help="print the CI matrix report at the end (auto: for a whole-suite run, under CI, or when "
                          "ENGINE_CI_ROW is set)")


def pytest_configure(config):
    folders = Path(config.rootpath) / "tests" / "platforms"
    found = sorted(p.name for p in folders.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))) \
        if folders.is_dir() else []
    for name in dict.fromkeys([*PLATFORM_MARKERS, *found]):
        config.addinivalue_line("markers", f"{name}: tests of the {name} platform (tests/platforms/{name})")
    config.addinivalue_line("markers", "core: tests of the device-free core (everything not platform-specific)")
    config.addinivalue_line("markers", "conformance: the conformance kit on the selected platform")
    config.addinivalue_line("markers", "csrc: the C++ kernel tests (ctest), csrc_<target> per build target")
    for target in ("host", "aarch64", "ppc64le", "riscv64"):
        config.addinivalue_line("markers", f"csrc_{target}: the C++ kernel tests built for {target}")
    config.addinivalue_line("markers", "isa: a test run once per CPU ISA path, isa_<name> for each")
    for name in (*PATHS, SCALAR):
        config.addinivalue_line("markers", f"isa_{name}: runs the {name} CPU path")
    config._ci_matrix = None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects on the markers added here
def pytest_collection_modifyitems(config, items):
    tests = Path(config.rootpath).resolve() / "tests"
    for item in items:
        try:
            rel = Path(str(item.path)).resolve().relative_to(tests).parts
        except ValueError:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for name in path_markers(rel, params):
            item.add_marker(name)


def _wanted(config) -> bool:
    choice = config.getoption("ci_matrix")
    if choice != "auto":
        return choice == "yes"
    whole_suite = config.args_source != pytest.Config.ArgsSource.ARGS  # no paths given: testpaths
    return whole_suite or bool(os.environ.get("CI")) or bool(os.environ.get("ENGINE_CI_ROW"))


def pytest_collection_finish(session):
    config = session.config
    if not _wanted(config):
        return
    tallies = {c.name: Tally() for c in CELLS}
    exprs = {c.name: Expression.compile(c.markexpr) for c in CELLS}
    cells_of, unassigned = {}, []
    for item in session.items:
        marks = {m.name for m in item.iter_markers()}
        names = [c.name for c in CELLS if exprs[c.name].evaluate(lambda n, marks=marks, **kw: n in marks)]
        for n in names:
            tallies[n].collected += 1
        cells_of[item.nodeid] = names
        if not names:
            unassigned.append(item.nodeid)
    config._ci_matrix = {"tallies": tallies, "cells_of": cells_of, "unassigned": unassigned, "final": {}}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    state = item.config._ci_matrix
    if state is None or item.nodeid not in state["cells_of"]:
        return
    rep = outcome.get_result()
    final = state["final"]
    if rep.failed:
        final[item.nodeid] = ("failed" if rep.when == "call" else "error", None)
    elif rep.skipped and item.nodeid not in final:
        if hasattr(rep, "wasxfail"):
            final[item.nodeid] = ("xfailed", None)
        else:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            final[item.nodeid] = ("skipped", reason.removeprefix("Skipped: "))
    elif rep.passed and rep.when == "call" and item.nodeid not in final:
        final[item.nodeid] = ("passed", None)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config._ci_matrix
    if state is None:
        return
    for nodeid, (outcome, reason) in state["final"].items():
        for name in state["cells_of"][nodeid]:
            tally = state["tallies"][name]
            tally.outcome[outcome] += 1
            if reason:
                tally.skips[reason] += 1
    row = os.environ.get("ENGINE_CI_ROW") or _MACHINE_ROW.get(os.uname().machine)
    if row not in ROWS:
        row = None
    terminalreporter.write_sep("=", f"CI matrix: row {row or '?'} (cells: tests/ci_matrix.py)")
    for line in report_lines(state["tallies"], state["unassigned"], row):
        terminalreporter.write_line(line, red=line.startswith("FAILED"), yellow=line.startswith(("NOT RUN", "NO CELL")),
                                    green=line.startswith("passed"))
