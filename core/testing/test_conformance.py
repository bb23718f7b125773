"""The kit's one test, parametrized by the plugin over every registered kernel of the platform."""

import pytest

from engine.core.testing.conformance import Unsupported, run_check


def test_kernel_matches_reference(engine_check, engine_kit):
    platform, _registry, seed = engine_kit
    try:
        run_check(engine_check, platform.device(), seed)
    except Unsupported as exc:
        pytest.skip(str(exc))
