"""The kit fails every mutant plugin (examples/kit-mutants) on every one of 8 fresh seeds, and passes right ones."""

from __future__ import annotations

import os
import re
import sys

import pytest

from engine.core.testing.conformance import fresh_seed
from engine.core.testing.kit import failures
from tests.plugin_helpers import REPO, run_engine

sys.path.insert(0, str(REPO / "examples" / "kit-mutants"))
from engine_kit_mutants import MUTANTS  # noqa: E402

SEEDS = 8


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda m: m.name)
def test_the_kit_fails_the_mutant_on_every_seed(mutant):
    op, words = MUTANTS[mutant]
    base = fresh_seed()
    for seed in range(base, base + SEEDS):
        found = failures(mutant(), seed, [op] if op else None)
        assert found, f"the kit passed {mutant.name} with seed {seed} (replay: ENGINE_TEST_SEED={seed})"
        assert re.search(words, found[0]), found[0]


def test_no_kernels_is_failed_naming_each_claimed_op():
    no_kernels = next(m for m in MUTANTS if m.name == "mutant_no_kernels")
    found = failures(no_kernels(), fresh_seed(), first=False)
    named = {f.split(" in ")[0].split("no kernel for ")[-1] for f in found if "no kernel for" in f}
    from engine.core import plugins
    from engine.core.ops import OPS

    # every op but the collectives, whose reference is the platform backend's own collective (gloo, NCCL, ...):
    # build_registry declares them reference-only, with that reason, where a platform registers none
    assert named == {name for name, op in OPS.items() if not op.collective}
    registry = plugins.build_registry(no_kernels())
    for name, op in OPS.items():
        if op.collective:
            assert "torch.distributed" in registry.reference_only_reason(op), name


def test_a_right_plugin_passes_the_same_run():
    from engine.platforms.cpu.platform import CpuPlatform

    seed = fresh_seed()
    assert failures(CpuPlatform(), seed, ["rms_norm", "paged_attention_decode"]) == []


def test_the_documented_kit_command_fails_an_installed_mutant(tmp_path):
    """End to end, as a vendor runs it: the mutant found through its entry point, the kit run by pytest."""
    info = tmp_path / "engine_kit_mutants-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: engine-kit-mutants\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[engine.platforms]\nmutant_eps_x10 = engine_kit_mutants.platforms:EpsTimesTen\n")
    path = os.pathsep.join([str(tmp_path), str(REPO / "examples" / "kit-mutants")])
    proc = run_engine(["--pyargs", "engine.core.testing", "--engine-platform", "mutant_eps_x10", "--engine-op",
                       "rms_norm", "-q", "-p", "no:cacheprovider", "-o", "addopts="], module="pytest",
                      env={"PYTHONPATH": path})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "mutant_eps_x10.eps_x10" in out and "exceed the bound" in out
