"""The CI matrix report (tests/ci_matrix.py): cells by marker, statuses that never pass a cell silently, the ISA
parameters that skip by name, and agreement between the cells, ROWS and .github/workflows/ci.yml."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest
from _pytest.mark.expression import Expression

from tests.ci_matrix import CELLS, ROWS, Cell, Tally, cell_status, matches, path_markers
from tests.isa_paths import kernel_isa_params
from tests.plugin_helpers import REPO

CELL = Cell("cpu kernels: avx512", "cpu and isa_avx512", ("x86-64",))


def tally(passed=0, failed=0, skipped=(), collected=None):
    t = Tally()
    t.outcome.update(passed=passed, failed=failed, skipped=len(skipped))
    t.skips.update(skipped)
    t.collected = passed + failed + len(skipped) if collected is None else collected
    return t


def test_cell_statuses():
    lacks = "avx512 path not run: this CPU lacks avx512f"
    assert cell_status(CELL, tally(passed=3, failed=1), "x86-64") == ("FAILED", "3 passed, 1 failed")
    assert cell_status(CELL, tally(passed=3, skipped=[lacks]), "x86-64") == \
        ("passed", f"3 passed, 1 skipped (skipped: {lacks})")
    assert cell_status(CELL, tally(skipped=[lacks] * 5), "x86-64") == ("NOT RUN", f"{lacks} [5]")
    assert cell_status(CELL, tally(), "x86-64") == ("NOT RUN", "no tests selected in this run")
    assert cell_status(CELL, tally(), "aarch64") == ("NOT RUN", "no tests selected in this run; runs on x86-64")
    assert cell_status(CELL, tally(collected=2), "x86-64")[0] == "NOT RUN"  # collected but never reported


def test_path_markers():
    assert path_markers(("platforms", "cpu", "test_x.py"), {}) == ["cpu"]
    assert path_markers(("platforms", "triton_kernels", "test_x.py"), {}) == ["triton_kernels"]
    assert path_markers(("platforms", "test_probes.py"), {}) == ["core"]
    assert path_markers(("csrc", "test_kernels_cpp.py"), {"target": "riscv64-vlen256"}) == \
        ["csrc", "csrc_riscv64_vlen256"]
    assert path_markers(("conformance", "test_selected_platform.py"), {}) == ["conformance"]
    assert path_markers(("core", "engine", "test_x.py"), {}) == ["core"]
    assert matches("cpu and not isa", {"cpu"}) and not matches("cpu and not isa", {"cpu", "isa", "isa_avx2"})


def test_isa_params_on_an_avx2_only_cpu_skip_avx512_by_name():
    params = kernel_isa_params(["avx2", "scalar"], "x86_64", {"avx2", "fma", "f16c"})
    assert [p.values[0] for p in params] == ["avx512", "avx2", "scalar"]
    skips = {p.values[0]: [m.kwargs["reason"] for m in p.marks if m.name == "skip"] for p in params}
    assert skips == {"avx512": ["avx512 path not run: this CPU lacks avx512f, avx512bw, avx512vl, avx512dq"],
                     "avx2": [], "scalar": []}
    assert {m.name for m in params[1].marks} == {"isa", "isa_avx2"}
    rvv = kernel_isa_params(["scalar"], "riscv64", {"i", "m", "a", "f", "d", "c"})
    assert [p.values[0] for p in rvv] == ["rvv", "scalar"]
    assert rvv[0].marks[-1].kwargs["reason"] == "rvv path not run: this CPU lacks v"


def test_cells_rows_and_markers_agree():
    known = {line.split(":")[0] for line in pytest_markers()}
    for cell in CELLS:
        Expression.compile(cell.markexpr)
        names = set(cell.markexpr.replace("(", " ").replace(")", " ").split()) - {"and", "or", "not"}
        assert names <= known, (cell.name, names - known)
        assert set(cell.rows) <= set(ROWS), cell
    assert len({c.name for c in CELLS}) == len(CELLS)


def pytest_markers() -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [line[len("@pytest.mark."):] for line in proc.stdout.splitlines() if line.startswith("@pytest.mark.")]


def test_workflow_rows_match_rows():
    yaml = pytest.importorskip("yaml")
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())["jobs"]
    assert jobs["x86-64"]["runs-on"] == ROWS["x86-64"].runner
    assert any(s.get("run") == "bash .ci/run" for s in jobs["x86-64"]["steps"])
    include = jobs["hardware"]["strategy"]["matrix"]["include"]
    assert {r["row"] for r in include} | {"x86-64"} == set(ROWS)
    in_tree = {ep.name for ep in entry_points(group="engine.platforms")}
    assert {"cpu", "cuda", "rocm", "xpu", "riscv", "ppc"} <= in_tree
    for r in include:
        row = ROWS[r["row"]]
        assert ", ".join(r["runs-on"]) == row.runner, r
        assert r["platform"] in in_tree or r["platform"] in r.get("markers", ""), r
        if "script" in r:
            assert r["script"].split()[-1] in row.runs and (REPO / r["script"].split()[-1]).exists()
        else:
            assert f"--engine-platform={r['platform']}" in row.runs and f"-m '{r['markers']}'" in row.runs, r
            Expression.compile(r["markers"])
        assert any(r["row"] in c.rows for c in CELLS), f"row {r['row']} runs no cell"


def test_report_of_a_run(tmp_path):
    """A real pytest run over a throw-away tests/ tree: a passing, a failing, a skipped-by-ISA and an unassigned
    test, each reported in its cell (or as in no cell), under the row ENGINE_CI_ROW names."""
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=prepend -p no:cacheprovider\n")
    tests = tmp_path / "tests"
    (tests / "platforms" / "cpu").mkdir(parents=True)
    (tests / "platforms" / "newchip").mkdir()
    (tests / "csrc").mkdir()
    (tests / "conftest.py").write_text(textwrap.dedent("""
        from tests.ci_matrix import (pytest_addoption, pytest_collection_finish, pytest_collection_modifyitems,
                                     pytest_configure, pytest_runtest_makereport, pytest_terminal_summary)
        """))
    (tests / "platforms" / "cpu" / "test_k.py").write_text(textwrap.dedent("""
        import pytest
        from tests.isa_paths import kernel_isa_params

        @pytest.mark.parametrize("isa", kernel_isa_params(["avx2", "scalar"], "x86_64", {"avx2", "fma", "f16c"}))
        def test_kernel(isa):
            pass
        """))
    (tests / "csrc" / "test_c.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("target", ["host", "riscv64"])
        def test_ctest(target):
            assert target == "host"
        """))
    (tests / "platforms" / "newchip" / "test_n.py").write_text("def test_n():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               ENGINE_CI_ROW="x86-64")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # the riscv64 failure
    assert "CI matrix: row x86-64" in out, out
    lines = {line[9:].split("  ")[0].strip(): line for line in out.splitlines()
             if line.startswith(("passed ", "FAILED ", "NOT RUN "))}
    assert lines["cpu kernels: avx2"].startswith("passed") and "1 passed" in lines["cpu kernels: avx2"]
    assert lines["cpu kernels: avx512"].startswith("NOT RUN")
    assert "avx512 path not run: this CPU lacks avx512f, avx512bw, avx512vl, avx512dq" in lines["cpu kernels: avx512"]
    assert lines["C++ kernel tests: host"].startswith("passed")
    assert lines["C++ kernel tests: riscv64 under qemu-user"].startswith("FAILED")
    assert lines["cpu kernels: neon"].startswith("NOT RUN") and "runs on aarch64" in lines["cpu kernels: neon"]
    assert lines["core: engine, models, loader, CLI, plugins"].startswith("NOT RUN")
    assert "NO CELL  1 tests are in no cell" in out and "tests/platforms/newchip/test_n.py::test_n" in out
    assert "NOT RUN here nvidia-hopper" in out and "this run     x86-64" in out
