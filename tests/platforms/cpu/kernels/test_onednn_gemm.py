"""The fp32 GEMM of the GGUF ops' dequantize-then-GEMM path (platforms/cpu/kernels/onednn_gemm.py): oneDNN against
torch's F.linear on fresh random inputs, and the gate that falls back to F.linear, telling the user once."""

from __future__ import annotations

import logging
import platform

import pytest
import torch
import torch.nn.functional as F

from engine.platforms.cpu import config
from engine.platforms.cpu.kernels import onednn_gemm
from tests import needs


@pytest.fixture
def fresh(monkeypatch):
    """An unchecked gate and no warning given yet, restored afterwards."""
    monkeypatch.setattr(onednn_gemm, "_state", {})
    monkeypatch.setattr(config, "_WARNED", set())


def test_onednn_is_used_on_x86():
    # torch's x86 wheels ship oneDNN: CI must run the fast path, not only its fallback
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"oneDNN is used on x86-64 only; this is {platform.machine()}")
    if not onednn_gemm.onednn_active():
        needs.unavailable("this torch has no working oneDNN linear (torch.ops.mkldnn._linear_pointwise)")


@pytest.mark.parametrize("shape", [(1, 64, 1), (65, 576, 37), (300, 1536, 13), (1024, 96, 130)],
                         ids=lambda s: "x".join(map(str, s)))
def test_matches_torch_linear(shape):
    m, k, n = shape
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) * k ** -0.5
    want = F.linear(x.double(), w.double()).float()
    torch.testing.assert_close(onednn_gemm.fp32_linear(x, w), want, rtol=1e-4, atol=1e-4)


def test_layouts_and_dtypes():
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    w = torch.randn(9, 64, generator=gen)
    x3 = torch.randn(2, 5, 64, generator=gen)  # leading dims kept
    torch.testing.assert_close(onednn_gemm.fp32_linear(x3, w), F.linear(x3, w), rtol=1e-5, atol=1e-5)
    xt = torch.randn(64, 7, generator=gen).t()  # column-major x
    torch.testing.assert_close(onednn_gemm.fp32_linear(xt, w), F.linear(xt, w), rtol=1e-5, atol=1e-5)
    wt = torch.randn(64, 9, generator=gen).t()  # column-major w
    torch.testing.assert_close(onednn_gemm.fp32_linear(xt, wt), F.linear(xt, wt), rtol=1e-5, atol=1e-5)
    assert onednn_gemm.fp32_linear(torch.randn(0, 64), w).shape == (0, 9)
    xb, wb = x3.bfloat16(), w.bfloat16()  # not fp32: torch's GEMM, unchanged
    assert torch.equal(onednn_gemm.fp32_linear(xb, wb), F.linear(xb, wb))


@pytest.mark.usefixtures("fresh")
def test_other_architectures_keep_torch_linear_quietly(monkeypatch, caplog):
    monkeypatch.setattr(onednn_gemm.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(onednn_gemm, "_onednn", lambda x, w: pytest.fail("oneDNN used off x86-64"))
    x, w = torch.randn(70, 64), torch.randn(5, 64)
    with caplog.at_level(logging.WARNING, logger="engine"):
        torch.testing.assert_close(onednn_gemm.fp32_linear(x, w), F.linear(x, w))
    assert not caplog.records and not onednn_gemm.onednn_active()


@pytest.mark.usefixtures("fresh")
def test_missing_onednn_falls_back_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(onednn_gemm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(onednn_gemm, "_onednn_op", lambda: None)
    monkeypatch.setattr(onednn_gemm, "_onednn", lambda x, w: pytest.fail("oneDNN called without passing its check"))
    x, w = torch.randn(70, 64), torch.randn(5, 64)
    with caplog.at_level(logging.WARNING, logger="engine"):
        torch.testing.assert_close(onednn_gemm.fp32_linear(x, w), F.linear(x, w))
        onednn_gemm.fp32_linear(x, w)
    said = [r.getMessage() for r in caplog.records if "oneDNN" in r.getMessage()]
    assert len(said) == 1 and "slower on AMD" in said[0]  # once a process
    assert not onednn_gemm.onednn_active()


@pytest.mark.usefixtures("fresh")
def test_wrong_onednn_results_fail_the_check(monkeypatch, caplog):
    monkeypatch.setattr(onednn_gemm.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(onednn_gemm, "_onednn", lambda x, w: F.linear(x, w) + 1.0)
    x, w = torch.randn(70, 64), torch.randn(5, 64)
    with caplog.at_level(logging.WARNING, logger="engine"):
        torch.testing.assert_close(onednn_gemm.fp32_linear(x, w), F.linear(x, w))
    assert any("failed its check" in r.getMessage() for r in caplog.records)
    assert not onednn_gemm.onednn_active()


def test_the_check_loads_no_more_of_torch():
    """The gate runs in a server's first request: it must not import torch.distributed.tensor and sympy (what
    torch.testing.assert_close pulls in: 0.6 s of the built-in model's first request on 2 cores)."""
    import subprocess
    import sys

    code = ("import sys; from engine.platforms.cpu.kernels import onednn_gemm; onednn_gemm.onednn_active(); "
            "print(sorted(m for m in ('sympy', 'torch.distributed.tensor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
