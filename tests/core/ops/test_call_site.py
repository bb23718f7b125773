"""CallSite: a model's op call resolves its implementation once per step-shape key, through the active registry,
and again when that registry changes or gains a kernel."""

from __future__ import annotations

import torch

from engine.core.ops import registry as reg_mod
from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import CallSite, KernelRegistry


def _counting(name, calls):
    def supports(x, weight, eps=0.0):
        calls.append(name)
        return True

    return supports


def test_resolves_once_per_key_and_again_after_changes(gen):
    before = reg_mod._ACTIVE
    try:
        calls: list[str] = []
        a = KernelRegistry("a")
        a.register(rms_norm, lambda x, w, eps: ("a", rms_norm.reference(x, w, eps)), name="k",
                   supports=_counting("a", calls))
        reg_mod.set_active_registry(a)
        site = CallSite(rms_norm)
        x, w = torch.randn(2, 8, generator=gen), torch.randn(8, generator=gen)
        for _ in range(3):
            tag, y = site((2,), x, w, 1e-6)
            assert tag == "a"
            torch.testing.assert_close(y, rms_norm.reference(x, w, 1e-6))
        assert calls == ["a"]  # supports() ran once: later calls were one lookup
        site((3,), torch.randn(3, 8, generator=gen), w, 1e-6)
        assert calls == ["a", "a"]  # a new key resolves again
        a.register(rms_norm, lambda x, w, eps: ("a2", x), name="better", priority=5, supports=_counting("a2", calls))
        assert site((2,), x, w, 1e-6)[0] == "a2"  # a kernel registered since: re-resolved
        b = KernelRegistry("b")
        reg_mod.set_active_registry(b)
        y = site((2,), x, w, 1e-6)  # a new active registry with nothing registered: the reference
        torch.testing.assert_close(y, rms_norm.reference(x, w, 1e-6))
    finally:
        reg_mod.set_active_registry(before)
