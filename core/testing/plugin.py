"""pytest plugin of the conformance kit (registered through the ``pytest11`` entry point).

Adds ``--engine-platform NAME`` (default: the platform engine would select) and ``--engine-seed N``
(default: ENGINE_TEST_SEED, else fresh random), and parametrizes any test that takes the
``engine_check`` fixture with every (op, implementation, case, dtype) of that platform.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    # One seed per run, shared by pytest-xdist's workers (they inherit the environment and must draw the same
    # cases to collect the same tests).
    if not hasattr(config, "workerinput") and not os.environ.get("ENGINE_TEST_SEED"):
        seed = config.getoption("engine_seed", None)
        from engine.core.testing.conformance import fresh_seed

        os.environ["ENGINE_TEST_SEED"] = str(fresh_seed() if seed is None else seed)


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
        from engine.core.testing.conformance import budget_for

        state = config._engine_kit = {"platform": platform, "registry": registry,
                                      "seed": fresh_seed() if seed is None else seed,
                                      "budget": budget_for(platform.device())}
    return state


def pytest_report_collectionfinish(config, start_path, items):
    if getattr(config, "_engine_kit", None) is None:
        return None
    from engine.core.testing.conformance import ops_without_kernel

    s = config._engine_kit
    lines = [f"engine conformance kit: platform={s['platform'].name} seed={s['seed']}"]
    bare = ops_without_kernel(s["registry"], config.getoption("engine_op"))
    declared = [op for op in bare if s["registry"].reference_only_reason(op)]
    if declared:
        lines.append(f"reference-only on {s['platform'].name} by declaration: {', '.join(declared)} (their references "
                     f"run on {s['platform'].device()} and are checked against the host's)")
    if set(bare) - set(declared):
        lines.append(f"no {s['platform'].name} kernel, and not declared reference-only, for: "
                     f"{', '.join(op for op in bare if op not in declared)} (the coverage tests fail them)")
    return lines


def pytest_generate_tests(metafunc):
    from engine.core.testing.conformance import collect_checks
    from engine.core.testing.coverage import collect_coverage

    if "engine_check" in metafunc.fixturenames:
        state = _kit_state(metafunc.config)
        checks = collect_checks(state["registry"], metafunc.config.getoption("engine_op"), seed=state["seed"],
                                budget=state["budget"])
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


@pytest.fixture
def engine_kit_budget(request) -> int:
    """The most work one drawn case may take on the kit's device (conformance.budget_for)."""
    return _kit_state(request.config)["budget"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    table = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for key, value in getattr(rep, "user_properties", ()):
                if key == "engine_coverage":
                    table.update(value)
    if table:
        from engine.core.testing.coverage import format_coverage

        terminalreporter.write_sep("-", "engine conformance kit: fraction of the cases each kernel took")
        for line in format_coverage(table):
            terminalreporter.write_line(line)
