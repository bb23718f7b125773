"""The whole kit as one call, for tools and for the kit's own tests: ``failures(platform, seed)``.

It runs what ``python -m pytest --pyargs engine.core.testing`` runs (registration, coverage, every check on
contiguous and strided inputs), in this process, and returns the failure messages instead of raising.
"""

from __future__ import annotations

from engine.core import plugins
from engine.core.ops import registry as ops_registry

from .conformance import ConformanceFailure, Unsupported, budget_for, collect_checks, run_check
from .coverage import collect_coverage, platform_facts, run_coverage


def failures(platform, seed: int, op_names=None, first: bool = True) -> list[str]:
    """Failure messages of the kit on ``platform`` (an instance) for ``seed``, restricted to ``op_names``; with
    ``first``, stop at the first one. An error registering the kernels is a failure too."""
    try:
        registry = plugins.build_registry(platform)
    except plugins.PlatformError as exc:
        return [str(exc)]
    before = ops_registry._ACTIVE
    ops_registry.set_active_registry(registry)
    device, budget = platform.device(), budget_for(platform.device())
    out = []
    try:
        for cov in collect_coverage(registry, platform.supported_dtypes(), op_names):
            try:
                run_coverage(cov, device, seed, budget, platform_facts(platform))
            except ConformanceFailure as exc:
                out.append(f"{cov.id}: {exc}")
                if first:
                    return out
        for check in collect_checks(registry, op_names, seed=seed, budget=budget):
            try:
                run_check(check, device, seed)
            except Unsupported:
                continue
            except ConformanceFailure as exc:
                out.append(str(exc))
                if first:
                    return out
    finally:
        ops_registry.set_active_registry(before)
    return out
