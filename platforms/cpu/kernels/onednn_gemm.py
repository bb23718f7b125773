"""fp32 ``x @ w.T`` through oneDNN (torch's mkldnn backend), for the GGUF ops' dequantize-then-GEMM path (prefill).

torch's ``F.linear`` in fp32 goes to MKL in the x86 wheels, which on the 2-core AMD Zen 5 host ran at 180-210
GFLOP/s, against 420-465 GFLOP/s for oneDNN's fp32 GEMM on the same shapes and threads (M = 453-2048, the default
model's layers; 2026-12-01) and ~460 for OpenBLAS at 2048^3. Through oneDNN the dequantize-then-GEMM path beats the
raw-row fused kernel at prefill sizes: the 32-prompt prefill of bench_cpu_vs_llamacpp.py took 0.90 s against 1.19 s,
a 512-token prompt 378 ms against 461 ms, with the same greedy tokens (same process, alternating, 4 rounds).

oneDNN is reached through ``torch.ops.mkldnn._linear_pointwise`` (the op torch's own compiler emits for CPU linears).
It is private to torch, so the first call checks it against ``F.linear`` on small random inputs; where it is missing
or disagrees on x86-64, the user is told once and ``F.linear`` runs instead. Other architectures (AArch64, POWER,
RISC-V) keep ``F.linear``: oneDNN was not measured there.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F

from engine.platforms.cpu.config import warn_once

_state: dict[str, bool] = {}  # "ok": oneDNN checked and used


def _onednn_op():
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def _onednn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def _check() -> bool:
    """Whether oneDNN's linear is there and agrees with F.linear (fp32, a few shapes, fresh random inputs); x86-64
    only."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if _onednn_op() is None:
        warn_once("this torch has no oneDNN linear (torch.ops.mkldnn._linear_pointwise): GGUF prefill GEMMs run on "
                  "torch's default fp32 GEMM, which is slower on AMD CPUs; a torch build with oneDNN (the official "
                  "x86-64 wheels have it) makes prompts faster")
        return False
    try:
        for m, k, n in ((3, 64, 5), (70, 96, 33)):
            x, w = torch.randn(m, k), torch.randn(n, k)
            got, want = _onednn(x, w), F.linear(x, w)
            # Not torch.testing.assert_close: it imports torch.distributed.tensor (and sympy), 0.6 s that the first
            # request paid.
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
                err = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
                raise AssertionError(f"[{m}, {k}] x [{n}, {k}]^T differs from F.linear: {err}")
    except (RuntimeError, AssertionError) as exc:
        warn_once(f"torch's oneDNN linear failed its check ({type(exc).__name__}: {str(exc)[:200]}); GGUF prefill "
                  "GEMMs run on torch's default fp32 GEMM instead")
        return False
    return True


def onednn_active() -> bool:
    """Whether fp32_linear uses oneDNN in this process (checked once, at the first call)."""
    if "ok" not in _state:
        _state["ok"] = _check()
    return _state["ok"]


def fp32_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for ``x`` [..., K] and ``w`` [N, K]: in fp32 on oneDNN where it passed its check, anything else
    (other dtypes, no oneDNN) through ``F.linear``."""
    if x.dtype != torch.float32 or w.dtype != torch.float32 or x.numel() == 0 or not onednn_active():
        return F.linear(x, w)
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = _onednn(x2, w if w.is_contiguous() else w.contiguous())
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.shape[0])
