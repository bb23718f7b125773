"""The kit's tests, parametrized by the plugin over every registered kernel of the platform."""

import pytest

from engine.core.testing.conformance import Unsupported, run_check
from engine.core.testing.coverage import platform_facts, run_coverage


def test_kernel_matches_reference(engine_check, engine_kit):
    platform, _registry, seed = engine_kit
    try:
        run_check(engine_check, platform.device(), seed)
    except Unsupported as exc:
        pytest.skip(str(exc))


def test_kernels_serve_every_dtype_and_shape_claimed(engine_coverage, engine_kit, engine_kit_budget, record_property):
    platform, _registry, seed = engine_kit
    if not engine_coverage.impls and engine_coverage.reference_only:
        pytest.skip(f"{engine_coverage.op.name} is reference-only on {platform.name}: {engine_coverage.reference_only}")
    taken = run_coverage(engine_coverage, platform.device(), seed, engine_kit_budget, platform_facts(platform))
    record_property("engine_coverage", {engine_coverage.id.removesuffix("-served"): taken})


def test_collectives_across_two_processes(engine_kit):
    from engine.core.testing.distributed import check_collectives_two_ranks

    platform, _registry, seed = engine_kit
    if platform.device_type != "cpu" and platform.device_count() < 2:
        pytest.skip(f"the collectives across two processes need two {platform.name} devices; "
                    f"{platform.device_count()} visible")
    check_collectives_two_ranks(platform.name, seed)
