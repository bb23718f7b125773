"""The GPU benchmarks are code: each one imports, builds its cases and runs its rows at its tiny size here, so that a
rename in the product code cannot break one unnoticed (issue 25: benchmarks/gpu/attention.py still called the removed
``attention._sm_count`` and crashed on the H200).

Without a GPU the Triton kernels run under the interpreter on CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1
before Triton is imported) and the benchmarks' timers run each call once (benchmarks/gpu/ceilings.py): every row's
code runs, kernel results are still checked against the references, the times mean nothing. On a GPU the same tiny
runs are timed for real. Gluon kernels cannot be interpreted: their benchmarks build the cases and time the Triton
and torch peers here, and launch the Gluon kernels only on an sm_90 GPU.

Paths that cannot run here (CUDA-graph capture, the Gluon launches off Hopper) are covered by ``test_names_resolve``:
every name a benchmark takes from the engine or from another benchmark module must exist.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest
import torch

from tests.plugin_helpers import REPO

pytest.importorskip("triton", reason="the GPU benchmarks need triton (pip install -e '.[test]')")

BENCH = REPO / "benchmarks"
FILES = [BENCH / "bench_gpu.py", *sorted((BENCH / "gpu").glob("*.py"))]
PROJECT = ("engine", "benchmarks")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
NO_GLUON = "Gluon kernels cannot run under the Triton interpreter: their launch needs an sm_90 (Hopper) CUDA GPU"


def _module(name: str):
    return importlib.import_module(f"benchmarks.gpu.{name}")


def _problems(rows: list[dict]) -> list[dict]:
    """Rows that report a wrong result, an error or a failed configuration."""
    bad = []
    for r in rows:
        words = f"{r.get('bench', '')} {r.get('goal', '')}"
        if ("error" in r or r.get("ok") is False or "WRONG" in words or "NOT BIT-EXACT" in words
                or "failed" in str(r.get("goal", "")) or not r.get("max_rel_err", 0) < 2e-2):
            bad.append(r)
    return bad


def _resolve(module: str, name: str):
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return getattr(mod, name)
    return importlib.import_module(f"{module}.{name}")  # a submodule not imported yet


# ---- every name a benchmark uses exists ------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_names_resolve(path: Path):
    """Each ``from engine... / benchmarks... import name`` resolves, and each ``alias.name`` on a module imported from
    them exists (a private helper included: ``attention._sm_count`` was one), in every function, run here or not."""
    tree = ast.parse(path.read_text(), str(path))
    missing, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in PROJECT:
            for alias in node.names:
                try:
                    obj = _resolve(node.module, alias.name)
                except (ImportError, AttributeError) as exc:
                    missing.append(f"line {node.lineno}: from {node.module} import {alias.name} ({exc})")
                    continue
                if inspect.ismodule(obj):
                    modules[alias.asname or alias.name] = obj
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    try:
                        mod = importlib.import_module(alias.name)
                    except ImportError as exc:
                        missing.append(f"line {node.lineno}: import {alias.name} ({exc})")
                        continue
                    if alias.asname:
                        modules[alias.asname] = mod
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and not hasattr(modules[node.value.id], node.attr)):
            missing.append(f"line {node.lineno}: {node.value.id}.{node.attr} "
                           f"({modules[node.value.id].__name__} has no {node.attr!r})")
    assert not missing, f"{path.relative_to(REPO)} uses names that do not exist:\n" + "\n".join(missing)


# ---- each benchmark at its tiny size ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, kwargs", [
    ("attention", dict(sweep=True)),
    ("moe", dict(sweep=True)),
    ("fp8", dict(sweep=True)),
    ("quant", dict(tune=True)),
    ("quant", dict(tune="wide")),
    ("int4", dict(sweep=True)),
    ("int8", {}),
    ("sass", {}),
    ("gemv", {}),
    ("mla", {}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_benchmark_tiny(name, kwargs):
    """Every row of the section (and the first setting of each sweep) at the module's tiny size; kernel results
    checked against the references as on the GPU."""
    rows = _module(name).run(tiny=True, **kwargs)
    assert rows, f"benchmarks/gpu/{name}.py returned no rows"
    assert not _problems(rows), _problems(rows)
    if name == "quant":  # a sweep whose configurations all fail leaves no row: each one left its best
        tuned = {r["bench"].split(" tuned-best")[0] for r in rows if "tuned-best" in r["bench"]}
        want = {"nvfp4_w4a16[dot]", "gguf_q4_0_dot"}  # the M = 64 sweeps
        if kwargs["tune"] is True:
            want |= {"nvfp4_w4a16[gemv]", "gguf_q4_0_gemv", "gguf_q8_0_gemv"}
        assert tuned == want, tuned


@pytest.mark.parametrize("mode", ["fp8", "nvfp4", "gemv", "defaults", "gemv1"])
def test_quant_sweep_tiny(mode, monkeypatch):
    """Each mode of quant_sweep.py; the gemv mode also loads an "earlier" nvfp4.py beside the current one."""
    qs = _module("quant_sweep")
    monkeypatch.setenv("NVFP4_OLD", str(REPO / "platforms" / "triton_kernels" / "nvfp4.py"))
    rows = qs.run(mode, tiny=True)
    assert not _problems(rows), _problems(rows)
    if mode == "gemv1":
        return
    assert rows
    if mode == "gemv":
        assert any(r["cfg"].startswith("old ") for r in rows)
    if mode == "nvfp4":
        assert set(qs.decide(rows)) == {"cfg", "score", "gemv_max_m"}


def test_fp8_gluon_cases():
    """fp8_gluon.py without the Gluon launches: its operands, the Triton kernel and the _scaled_mm peer per shape."""
    fg = _module("fp8_gluon")
    rows = fg.run(tiny=True, gluon=False)
    shapes = fg.TINY["shapes"]
    assert len(rows) == sum(len(fg.VARIANTS) if m == n == k else 1 for m, n, k in shapes), rows
    assert not _problems(rows), _problems(rows)


def test_nvfp4_gluon_cases():
    """nvfp4_gluon.py without the Gluon launches: the copy ceiling, cuBLAS and the Triton default per shape and M."""
    ng = _module("nvfp4_gluon")
    rows = ng.rows(ng.CONFIGS, **ng.TINY, device="cuda" if torch.cuda.is_available() else "cpu", gluon=False,
                   wrong=ng.WRONG_TINY)
    shapes, ms = ng.TINY["shapes"], ng.TINY["ms"]
    assert sum(r["kernel"] == "triton" for r in rows) == len(shapes) * len(ms), rows
    assert sum(r["kernel"] == "ceiling" for r in rows) == len(shapes), rows
    assert not _problems(rows), _problems(rows)
    assert ng.summary(rows, **ng.TINY) == []  # no Gluon rows to rank


@pytest.mark.skipif(not HOPPER, reason=NO_GLUON)
def test_fp8_gluon_launch():
    fg = _module("fp8_gluon")
    rows = fg.run(tiny=True, gluon=True)
    assert rows and all("us" in r for r in rows), rows
    assert not _problems(rows), _problems(rows)


@pytest.mark.skipif(not HOPPER, reason=NO_GLUON)
def test_nvfp4_gluon_launch():
    ng = _module("nvfp4_gluon")
    rows = ng.rows(ng.CONFIGS, **ng.TINY, gluon=True, wrong=ng.WRONG_TINY)
    gluon = [r for r in rows if r["kernel"] == "gluon"]
    assert len(gluon) == len(ng.CONFIGS) * len(ng.TINY["ms"]) * len(ng.TINY["shapes"]), rows
    assert not _problems(rows), _problems(rows)
    assert ng.summary(rows, **ng.TINY)


# ---- bench_gpu.py ----------------------------------------------------------------------------------------------


def test_bench_gpu_tiny(tmp_path):
    """bench_gpu.py --tiny: the ceilings and the engine section (HF generate beside the engine on a 2-layer random
    Llama, graph replay timing, the decode profile); its kernel sections are the modules run above, each importable
    by the name it dispatches and taking ``tiny``."""
    bench_gpu = importlib.import_module("benchmarks.bench_gpu")
    for name in bench_gpu.KERNEL_SECTIONS:
        assert "tiny" in inspect.signature(_module(name).run).parameters, name
    assert bench_gpu.main(["--tiny", "--only", "engine", "--profile", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert not result["errors"], "\n".join(result["errors"].values())
    rows = result["sections"]["engine"]
    assert [r["bench"] for r in rows] == ["engine generate tiny", "engine single request tiny", "profile tiny"]
    assert all(r["tok_s"] > 0 and r["peer_tok_s"] > 0 for r in rows[:2]), rows
    assert (tmp_path / "bench_gpu.md").read_text().startswith(result["device"])
    assert list(tmp_path.glob("profile_tiny_2req.txt"))



def test_quant_models_tiny(tmp_path):
    """quant_models.py at its tiny size: each format's checkpoint loads kept in its format (not expanded), is smaller
    than the one before it, decodes, and its rows (with the ratio to bf16) are appended to the results file."""
    rows = _module("quant_models").run(tiny=True, out=tmp_path)
    by = {(r["bench"].split()[-1], r["shape"].split()[0]): r for r in rows}
    formats = ("bf16", "fp8", "nvfp4", "gptq", "gptq8")
    assert set(by) == {(f, b) for f in formats for b in ("1", "2")}, sorted(by)
    kept = {f: by[f, "1"]["weights"] for f in formats}
    # GPTQ stays 4- / 8-bit: as it is where the platform has the int4_linear / int8_linear kernel (the GPUs), as GGUF
    # Q4_0 / Q8_0 blocks on the CPU
    gpu = torch.cuda.is_available()
    assert kept == {"bf16": "Tensor", "fp8": "Fp8Weight", "nvfp4": "Nvfp4Weight",
                    "gptq": "Int4Weight" if gpu else "QuantizedWeight",
                    "gptq8": "Int8Weight" if gpu else "QuantizedWeight"}, kept
    size = {f: by[f, "1"]["checkpoint_bytes"] for f in kept}
    assert size["bf16"] > size["gptq8"] > size["nvfp4"] > 0 and size["fp8"] > size["gptq"] > 0, size
    assert all(r["tok_s"] > 0 and r["vs_bf16"] > 0 for r in rows), rows
    assert len((tmp_path / "quant_models.jsonl").read_text().splitlines()) == len(rows)


def test_first_request_tiny(tmp_path):
    """first_request.py at its tiny size: both engines (warm-up off, on) serve each batch size twice, the warm-up's
    time is reported where it ran, and the rows reach the results file."""
    rows = _module("first_request").run(tiny=True, out=tmp_path)
    assert [(r["bench"].split()[-1], r["shape"].split()[0]) for r in rows] == [
        ("off", "1"), ("off", "4"), ("on", "1"), ("on", "4")]
    assert all(r["first_tok_s"] > 0 and r["warm_tok_s"] > 0 and r["ratio"] > 0 for r in rows), rows
    assert [r["warmup_s"] is None for r in rows] == [True, True, False, False]
    assert len((tmp_path / "first_request.jsonl").read_text().splitlines()) == 4


def test_spec_decode_tiny(tmp_path):
    """spec_decode.py at its tiny size (fp32 on the CPU): k = 0 at batch 1 and 4, the oracle's drafts all accepted
    and its outputs equal to plain decoding (no near-tie flips in fp32 here), and the verify graphs in use."""
    module = _module("spec_decode")
    rows = module.run(tiny=True, out=tmp_path)
    oracle = [r for r in rows if r["bench"].startswith("spec decode oracle")]
    assert len(oracle) == 2 and all(r["same_tokens"] and r["measured_acceptance"] == 1.0 for r in oracle)
    assert all(r["verify_over_decode_step"] > 0 and r["speedup_at_0.9"] > r["speedup_at_0.7"] for r in oracle)
    assert module.expected_tokens(1.0, 4) == 5 and abs(module.expected_tokens(0.5, 2) - 1.75) < 1e-12
    graphs = rows[-1]
    assert graphs["verify_disabled"] is None and graphs["verify_graphs"] > 0
    assert len((tmp_path / "spec_decode.jsonl").read_text().splitlines()) == len(rows)


def test_gemv_loops_need_no_shared_memory():
    """The int4, int8 and FP8 GEMVs' main loops compiled for sm_90 have no barrier: their scale / x tiles load in
    the weights' layout (a layout conversion through shared memory put 70 barriers a step in the int4 GEMV and 4 in
    the FP8 one before session 27)."""
    rows = [r for r in _module("sass").run(only="GEMV") if "GGUF" not in r["bench"]]  # GGUF's: not yet
    assert len(rows) == 3 and all(r["loop_instructions"] > 50 for r in rows), rows
    assert all(r["loop_barriers"] == 0 for r in rows), [(r["bench"], r["loop_barriers"]) for r in rows]
