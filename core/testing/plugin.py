"""pytest plugin of the conformance kit (registered through the ``pytest11`` entry point).

Adds ``--engine-platform NAME`` (default: the platform engine would select) and ``--engine-seed N``
(default: ENGINE_TEST_SEED, else fresh random), and parametrizes any test that takes the
``engine_check`` fixture with every (op, implementation, case, dtype) of that platform.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("engine", "engine conformance kit")
    group.addoption("--engine-platform", default=None,
                    help="platform whose kernels the conformance kit checks (default: the one engine selects)")
    group.addoption("--engine-seed", type=int, default=None,
                    help="seed for the kit's random inputs (default: ENGINE_TEST_SEED, else fresh)")
    group.addoption("--engine-op", action="append", default=None,
                    help="check only this op (repeatable)")


def _kit_state(config):
    state = getattr(config, "_engine_kit", None)
    if state is None:
        from engine.core import plugins
        from engine.core.testing.conformance import fresh_seed

        name = config.getoption("engine_platform")
        try:
            rec = plugins.select(plugins.discover(), name)
            platform = rec.platform_cls()
            registry = plugins.build_registry(platform)
        except plugins.PlatformError as exc:
            raise pytest.UsageError(f"engine conformance kit: {exc}") from exc
        seed = config.getoption("engine_seed")
        state = config._engine_kit = {"platform": platform, "registry": registry,
                                      "seed": fresh_seed() if seed is None else seed}
    return state


def pytest_report_collectionfinish(config, start_path, items):
    if getattr(config, "_engine_kit", None) is None:
        return None
    from engine.core.testing.conformance import ops_without_kernel

    s = config._engine_kit
    lines = [f"engine conformance kit: platform={s['platform'].name} seed={s['seed']}"]
    bare = ops_without_kernel(s["registry"], config.getoption("engine_op"))
    if bare:
        lines.append(f"no {s['platform'].name} kernel for: {', '.join(bare)} (their references run on "
                     f"{s['platform'].device()} and are checked against the host's)")
    return lines


def pytest_generate_tests(metafunc):
    from engine.core.testing.conformance import collect_checks, collect_coverage

    if "engine_check" in metafunc.fixturenames:
        state = _kit_state(metafunc.config)
        checks = collect_checks(state["registry"], metafunc.config.getoption("engine_op"))
        metafunc.parametrize("engine_check", checks, ids=[c.id for c in checks])
    if "engine_coverage" in metafunc.fixturenames:
        state = _kit_state(metafunc.config)
        covs = collect_coverage(state["registry"], state["platform"].supported_dtypes(),
                                metafunc.config.getoption("engine_op"))
        metafunc.parametrize("engine_coverage", covs, ids=[c.id for c in covs])


@pytest.fixture
def engine_kit(request):
    """(platform, registry, seed) of the kit's run."""
    s = _kit_state(request.config)
    return s["platform"], s["registry"], s["seed"]
