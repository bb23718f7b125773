"""A call that falls to the plain-torch reference although the platform has kernels for the op is told once, with
each kernel's reason; an op the platform offers nothing for stays quiet (the reference is its implementation)."""

from __future__ import annotations

import logging

import torch

from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import KernelRegistry


def _fp32_only(x, weight, eps=0.0):
    return True if x.dtype == torch.float32 else f"dtype {x.dtype} not supported (fp32 only)"


def test_reference_fallback_is_told_once_with_the_reason(caplog):
    reg = KernelRegistry("testplat")
    reg.register(rms_norm, rms_norm.reference, name="fast", supports=_fp32_only)
    x16, w16 = torch.randn(3, 8, dtype=torch.float16), torch.randn(8, dtype=torch.float16)
    with caplog.at_level(logging.WARNING, logger="engine"):
        assert reg.select(rms_norm, (torch.randn(3, 8), torch.randn(8), 1e-6)).name == "fast"
        assert not caplog.records
        for rows in (3, 5, 3):  # two cache misses with the same reason, one hit: one message
            assert reg.select(rms_norm, (x16[:rows] if rows <= 3 else torch.randn(rows, 8, dtype=torch.float16),
                                         w16, 1e-6)).platform == "core"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert "rms_norm" in messages[0] and "testplat.fast: dtype torch.float16 not supported" in messages[0]


def test_skipped_kernels_count_and_unclaimed_ops_are_quiet(caplog):
    reg = KernelRegistry("testplat")
    x, w = torch.randn(2, 4), torch.randn(4)
    skipping = KernelRegistry("testplat")
    skipping.skip(rms_norm, "native", "library not built")
    with caplog.at_level(logging.WARNING, logger="engine"):
        reg.select(rms_norm, (x, w, 1e-6))
        assert not caplog.records
        skipping.select(rms_norm, (x, w, 1e-6))
    assert len(caplog.records) == 1 and "testplat.native: library not built" in caplog.records[0].getMessage()
