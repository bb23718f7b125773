"""Whole models under ENGINE_CPU_ISA: for each kernel ISA other than this CPU's default (which the rest of the suite
runs end to end), a fresh process forced onto it computes the tiny dense and MoE models' logits and matches
HF transformers (tests/core/models/test_tiny_random_vs_hf.py). An ISA this CPU lacks is a skip naming it."""

import os
import subprocess
import sys

import pytest

from engine.platforms.cpu import _native
from tests.isa_paths import kernel_isa_params
from tests.plugin_helpers import REPO

pytest.importorskip("transformers")

DEFAULT = _native.supported_isas()[0]
FAMILIES = ("llama", "mixtral")  # dense, and MoE through the native fused_moe
RUN = """
import os, sys, pytest
from engine.platforms.cpu import _native
assert _native.isa() == os.environ["ENGINE_CPU_ISA"], (_native.isa(), os.environ["ENGINE_CPU_ISA"])
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("forced", [p for p in kernel_isa_params(_native.supported_isas()) if p.values[0] != DEFAULT])
def test_models_match_transformers_under_forced_isa(forced):
    ids = [f"tests/core/models/test_tiny_random_vs_hf.py::test_logits_match_transformers[{f}]" for f in FAMILIES]
    env = dict(os.environ, ENGINE_CPU_ISA=forced)
    proc = subprocess.run([sys.executable, "-c", RUN, "-q", "-p", "no:cacheprovider", "--ci-matrix=no", *ids],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and f"{len(ids)} passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
