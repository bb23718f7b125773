"""The conformance kit catches wrong kernels, and passes right ones."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import KernelRegistry
from engine.core.testing.conformance import (
    HOST_BUDGET,
    ConformanceFailure,
    Unsupported,
    collect_checks,
    fresh_seed,
    ops_without_kernel,
    run_check,
)
from engine.core.testing.coverage import collect_coverage, run_coverage
from tests.plugin_helpers import run_engine, write_plugin_dist


def _registry_with(fn, supports=None) -> KernelRegistry:
    reg = KernelRegistry("test")
    reg.register(rms_norm, fn, name="candidate", supports=supports)
    return reg


def _run_all(reg: KernelRegistry):
    seed = fresh_seed()
    for check in collect_checks(reg, ["rms_norm"], seed=seed):
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
    assert "exceed the bound derived from the reference" in proc.stdout


def test_kit_refuses_an_unavailable_platform():
    proc = run_engine(["--pyargs", "engine.core.testing", "--engine-platform", "rocm", "-q",
                       "-p", "no:cacheprovider", "-o", "addopts="], module="pytest")
    assert proc.returncode != 0 and "not available here" in proc.stdout + proc.stderr


def _rms_exact(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _checks(reg, **kw):
    return collect_checks(reg, ["rms_norm"], **kw)


def test_a_truncating_bf16_kernel_fails():
    def truncating(x, w, eps):
        y = _rms_exact(x.float(), w.float(), eps)  # fp32 result, then cut to bf16 by dropping the low bits
        return (y.view(torch.int32) & ~0xFFFF).view(torch.float32).to(x.dtype)

    reg = _registry_with(truncating)
    bf16 = [c for c in _checks(reg, strided=False) if c.dtype == torch.bfloat16 and c.case.name != "tiny"]
    for check in bf16:
        with pytest.raises(ConformanceFailure, match="truncated instead of rounded"):
            run_check(check, torch.device("cpu"), fresh_seed())
    for check in _checks(_registry_with(_rms_exact), strided=False):  # the rounding kernel passes
        run_check(check, torch.device("cpu"), fresh_seed())


def test_supports_that_raises_is_a_failure_not_a_skip():
    reg = _registry_with(_rms_exact, supports=lambda x, w, eps: x.no_such_attribute)
    with pytest.raises(ConformanceFailure, match="supports\\(\\) raised AttributeError"):
        run_check(_checks(reg)[0], torch.device("cpu"), 0)
    (cov,) = collect_coverage(reg, (torch.float32,), ["rms_norm"])
    with pytest.raises(ConformanceFailure, match="never raise"):
        run_coverage(cov, torch.device("cpu"), 0, HOST_BUDGET)


def test_a_kernel_that_declines_every_case_of_a_claimed_dtype_fails():
    reg = _registry_with(_rms_exact, supports=lambda x, w, eps: x.dtype == torch.float32 or "fp32 only")
    covs = collect_coverage(reg, (torch.float32, torch.bfloat16), ["rms_norm"])
    assert [c.dtype for c in covs] == [torch.float32, torch.bfloat16]
    run_coverage(covs[0], torch.device("cpu"), fresh_seed(), HOST_BUDGET)
    with pytest.raises(ConformanceFailure, match="claims bfloat16 .* declines every one"):
        run_coverage(covs[1], torch.device("cpu"), fresh_seed(), HOST_BUDGET)
    narrow = KernelRegistry("test")
    narrow.register(rms_norm, _rms_exact, name="fp32_only", dtypes=(torch.float32,),
                    supports=lambda x, w, eps: x.dtype == torch.float32 or "fp32 only")
    narrow.reference_only(rms_norm, "bf16 through the reference on purpose", dtypes=(torch.bfloat16,))
    for cov in collect_coverage(narrow, (torch.float32, torch.bfloat16), ["rms_norm"]):
        run_coverage(cov, torch.device("cpu"), fresh_seed(), HOST_BUDGET)


def test_a_claimed_dtype_without_a_kernel_fails_unless_declared_reference_only():
    narrow = KernelRegistry("test")
    narrow.register(rms_norm, _rms_exact, name="fp32_only", dtypes=(torch.float32,))
    bf16 = [c for c in collect_coverage(narrow, (torch.float32, torch.bfloat16), ["rms_norm"])
            if c.dtype == torch.bfloat16][0]
    with pytest.raises(ConformanceFailure, match="no kernel for rms_norm in bfloat16.*reference_only"):
        run_coverage(bf16, torch.device("cpu"), fresh_seed(), HOST_BUDGET)


def test_a_registration_for_no_dtype_is_refused():
    with pytest.raises(ValueError, match="dtypes=\\(\\)"):
        KernelRegistry("test").register(rms_norm, _rms_exact, name="nothing", dtypes=())


def test_a_kernel_that_ignores_strides_fails_the_strided_check():
    def ignores_strides(x, w, eps):  # reads memory as if x were contiguous, as a raw-pointer kernel might
        dense = torch.as_strided(x, x.shape, (x.shape[-1], 1)) if x.dim() == 2 else x
        return _rms_exact(dense, w, eps)

    checks = _checks(_registry_with(ignores_strides))
    strided = [c for c in checks if c.strided]  # (the fixed cases: fresh_seed is not passed to collect_checks)
    assert strided and len(strided) == len(checks) // 2
    for check in strided:
        with pytest.raises(ConformanceFailure, match="exceed the bound derived|correctly rounded|non-finite"):
            run_check(check, torch.device("cpu"), fresh_seed())
    for check in checks:
        if not check.strided:
            run_check(check, torch.device("cpu"), fresh_seed())
    declining = _registry_with(ignores_strides, supports=lambda x, w, eps: x.is_contiguous() or "contiguous only")
    with pytest.raises(Unsupported, match="strided inputs.*contiguous only"):
        run_check([c for c in _checks(declining) if c.strided][0], torch.device("cpu"), 0)


def test_a_kernel_that_writes_its_inputs_fails():
    def scribbles(x, w, eps):
        out = _rms_exact(x, w, eps)
        x.mul_(2)
        return out

    with pytest.raises(ConformanceFailure, match="argument 0 was modified"):
        run_check(_checks(_registry_with(scribbles), strided=False)[0], torch.device("cpu"), fresh_seed())


def test_ops_without_a_kernel_are_checked_through_their_reference():
    reg = KernelRegistry("bare")
    checks = collect_checks(reg, ["rms_norm", "silu_and_mul"])
    assert checks and all(c.impl.platform == "core" and not c.strided for c in checks)
    assert ops_without_kernel(reg, ["rms_norm", "silu_and_mul"]) == ["rms_norm", "silu_and_mul"]
    for check in checks:
        run_check(check, torch.device("cpu"), fresh_seed())


# each a kernel that is right in one process and wrong across ranks: it ignores the other rank
WRONG_COLLECTIVES = {
    "all_reduce": "lambda x: x.clone()",
    "all_gather": "lambda x: torch.stack([x, x])",
    "broadcast": "lambda x, src: x.clone()",
}


@pytest.mark.parametrize("op", sorted(WRONG_COLLECTIVES))
def test_kit_fails_a_wrong_collective_across_two_processes(tmp_path, op):
    site = write_plugin_dist(tmp_path, "lonely-vendor", "lonely", "lonely_mod", f"""
        import torch
        from engine.core.platform import Platform
        class Lonely(Platform):
            name = "lonely"
            priority = 1
            @classmethod
            def probe(cls):
                return True, "emulated"
            def register_kernels(self, registry):
                registry.register({op!r}, {WRONG_COLLECTIVES[op]}, name="forgets_other_ranks")
        """, "Lonely")
    proc = run_engine(["--pyargs", "engine.core.testing", "--engine-platform", "lonely", "-q", "-k",
                       "two_processes", "-p", "no:cacheprovider", "-o", "addopts="], site, module="pytest")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "lonely.forgets_other_ranks" in out and f"{op}-lonely.forgets_other_ranks" in out, out
    assert "differs from the reference" in out or "exceed" in out, out
