"""The conformance kit catches wrong kernels, and passes right ones."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import KernelRegistry
from engine.core.testing.conformance import (
    ConformanceFailure,
    Unsupported,
    collect_checks,
    fresh_seed,
    run_check,
)
from tests.plugin_helpers import run_engine, write_plugin_dist


def _registry_with(fn, supports=None) -> KernelRegistry:
    reg = KernelRegistry("test")
    reg.register(rms_norm, fn, name="candidate", supports=supports)
    return reg


def _run_all(reg: KernelRegistry):
    seed = fresh_seed()
    for check in collect_checks(reg, ["rms_norm"]):
        try:
            run_check(check, torch.device("cpu"), seed)
        except Unsupported:
            continue


def test_a_correct_kernel_passes():
    _run_all(_registry_with(lambda x, w, eps: (x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True)
                                                                            + eps) * w.double()).to(x.dtype)))


@pytest.mark.parametrize("wrong", [
    lambda x, w, eps: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps),  # forgets the weight
    lambda x, w, eps: (x.float() * torch.rsqrt(x.float().square().sum(-1, keepdim=True) + eps) * w).to(x.dtype),
    lambda x, w, eps: (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps) * w.float()),
], ids=["no-weight", "sum-not-mean", "wrong-dtype"])
def test_a_wrong_kernel_fails(wrong):
    with pytest.raises(ConformanceFailure, match="ENGINE_TEST_SEED="):
        _run_all(_registry_with(wrong))


def test_declined_inputs_are_reported_not_run():
    reg = _registry_with(lambda x, w, eps: 1 / 0, supports=lambda x, w, eps: "never")
    check = collect_checks(reg, ["rms_norm"])[0]
    with pytest.raises(Unsupported, match="never"):
        run_check(check, torch.device("cpu"), 0)


def test_kit_fails_a_vendor_plugin_with_a_wrong_kernel(tmp_path):
    """End to end: a plugin registering a wrong rms_norm makes the documented kit command fail."""
    site = write_plugin_dist(tmp_path, "wrong-vendor", "wrongvendor", "wrong_vendor_mod", """
        from engine.core.platform import Platform
        class Wrong(Platform):
            name = "wrongvendor"
            priority = 1
            @classmethod
            def probe(cls):
                return True, "emulated"
            def register_kernels(self, registry):
                registry.register("rms_norm", lambda x, w, eps: x * w, name="bad_rms_norm")
        """, "Wrong")
    proc = run_engine(["--pyargs", "engine.core.testing", "--engine-platform", "wrongvendor", "-q",
                       "-p", "no:cacheprovider", "-o", "addopts="], site, module="pytest")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "rms_norm-wrongvendor.bad_rms_norm" in proc.stdout
    assert "differs from the reference" in proc.stdout


def test_kit_refuses_an_unavailable_platform():
    proc = run_engine(["--pyargs", "engine.core.testing", "--engine-platform", "cuda", "-q",
                       "-p", "no:cacheprovider", "-o", "addopts="], module="pytest")
    assert proc.returncode != 0 and "not available here" in proc.stdout + proc.stderr
