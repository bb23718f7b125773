"""ENGINE_CPU_ISA / ENGINE_NUM_THREADS: a bad value is a clear error from the Python API and from `engine generate`,
`bench` and `doctor` (exit 2, one line, no traceback), never a quiet fall-back to the references; too many threads
is a warning."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from engine.platforms.cpu import _native, config
from engine.platforms.cpu.platform import CpuPlatform
from tests.plugin_helpers import REPO, run_engine

LACKED = next((n for n in config.ISA_NAMES if n not in _native.supported_isas()), None)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "", " "])
def test_bad_thread_counts_are_errors(value):
    with pytest.raises(config.CpuConfigError, match=f"ENGINE_NUM_THREADS.*whole number >= 1.*got {value!r}"):
        config.check_env({"ENGINE_NUM_THREADS": value})


def test_unknown_isa_is_an_error_naming_the_known_ones():
    with pytest.raises(config.CpuConfigError, match="'avx1024'.*avx512, avx2, neon, vsx, rvv, scalar"):
        config.check_env({"ENGINE_CPU_ISA": "avx1024"})
    assert config.check_env({"ENGINE_CPU_ISA": _native.isa(), "ENGINE_NUM_THREADS": "1"}) == []


def test_more_threads_than_cpus_warns_once(monkeypatch, caplog):
    too_many = str(config.usable_cpus() + 3)
    assert "more than the" in config.check_env({"ENGINE_NUM_THREADS": too_many})[0]
    monkeypatch.setenv("ENGINE_NUM_THREADS", too_many)
    with caplog.at_level(logging.WARNING, logger="engine"):
        CpuPlatform()
        CpuPlatform()
    told = [r.getMessage() for r in caplog.records if f"ENGINE_NUM_THREADS={too_many}" in r.getMessage()]
    assert len(told) == 1, told


def test_the_platform_refuses_a_bad_setting(monkeypatch):
    monkeypatch.setenv("ENGINE_NUM_THREADS", "0")
    with pytest.raises(config.CpuConfigError):
        CpuPlatform()


def test_python_api_raises_for_an_isa_this_cpu_lacks():
    if LACKED is None:
        pytest.skip("this CPU runs every ISA the engine knows")
    code = "from engine import LLM\nLLM(platform='cpu')"  # cpu: a GPU machine's default is its GPU
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**_env(), "ENGINE_CPU_ISA": LACKED})
    assert proc.returncode != 0
    assert "CpuConfigError" in proc.stderr and f"'{LACKED}'" in proc.stderr and "cannot run it" in proc.stderr


@pytest.mark.parametrize("command, var, value", [
    (["generate", "--platform", "cpu", "hi"], "ENGINE_CPU_ISA", "avx1024"),
    (["bench", "--platform", "cpu", "--num-prompts", "1"], "ENGINE_NUM_THREADS", "0"),
    (["doctor", "--platform", "cpu"], "ENGINE_CPU_ISA", LACKED or "sse9"),
])
def test_cli_commands_exit_2_with_one_line(command, var, value):
    proc = run_engine(command, env={var: value})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and var in lines[0] and value in lines[0] and "Traceback" not in proc.stderr, lines


def _env():
    import os

    return {k: v for k, v in os.environ.items() if k not in ("ENGINE_PLATFORM", "ENGINE_CPU_ISA", "ENGINE_NUM_THREADS")}
