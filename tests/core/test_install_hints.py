"""`engine doctor`'s install hints (the GPU plugins' probe reasons) give README.md's install commands, verbatim, with
the same torch pin as the README's set-up."""

from __future__ import annotations

import re
from pathlib import Path

from engine.platforms import cuda, rocm, xpu

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_cuda_hint_is_the_readmes_gpu_set_up():
    ok, why = cuda.probe_reason(False, None, "2.13.0+cpu", 0)
    assert not ok and "built without CUDA" in why
    for command in ("pip uninstall -y torch", cuda.INSTALL_TORCH, cuda.INSTALL_EXTRA):
        assert command in why and command in README, command


def test_rocm_and_xpu_hints_are_the_readmes():
    assert rocm.INSTALL_EXTRA in rocm.probe_reason(None, "2.13.0+cpu", 0)[1] and rocm.INSTALL_EXTRA in README
    why = xpu.probe_reason(False, "2.3.0", 0)[1]
    for command in (xpu.INSTALL_TORCH, xpu.INSTALL_EXTRA):
        assert command in why and command in README, command


def test_one_torch_pin_everywhere():
    pins = set(re.findall(r"torch==([0-9.]+)", README + cuda.INSTALL_TORCH + xpu.INSTALL_TORCH))
    assert len(pins) == 1, pins
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text(encoding="utf-8")
    assert set(re.findall(r"torch==([0-9.]+)", ci)) == pins


def test_rocm_and_xpu_extras_leave_torchs_own_triton_alone():
    """ROCm and XPU torch bring their own Triton build in the `triton` package; an extra asking for upstream `triton`
    would overwrite it (and XPU's FP8 GEMM is oneDNN inside torch: no `onednn` wheel either)."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {k: {re.split(r"[<>=!~\[; ]", dep)[0].lower() for dep in v} for k, v in extras.items()}
    assert "triton" not in names["rocm"] and "triton" not in names["xpu"], names
    assert names["xpu"] == set() and names["rocm"] == {"amd-aiter"}, names
    assert "triton" in names["cuda"]
