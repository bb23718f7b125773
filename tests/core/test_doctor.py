"""``engine doctor``: the plugin table, the selection, the op table, and its exit codes."""

from __future__ import annotations

from engine.core.ops.registry import OPS
from tests.plugin_helpers import default_platform, doctor_json, run_engine


def test_doctor_selects_cpu_with_an_op_table():
    proc = run_engine(["doctor"])
    assert proc.returncode == 0, proc.stderr
    assert f"Selected platform: {default_platform()}" in proc.stdout
    for name in OPS:
        assert name in proc.stdout


def test_doctor_json_covers_every_op_and_dtype():
    info = doctor_json()
    assert info["_returncode"] == 0 and info["selected"] == default_platform() and info["error"] is None
    for name, op in OPS.items():
        dtypes = info["ops"][name]["dtypes"]
        assert set(dtypes) == {str(d).removeprefix("torch.") for d in op.dtypes}
        for choice in dtypes.values():
            assert "chosen" in choice, choice


def test_forced_unavailable_platform_exits_nonzero_saying_why():
    # rocm: unavailable both here and on the NVIDIA machines the suite also runs on
    proc = run_engine(["doctor"], env={"ENGINE_PLATFORM": "rocm"})
    assert proc.returncode != 0
    assert "'rocm' was forced but is not available here" in proc.stdout + proc.stderr
    assert "not a ROCm (HIP) build" in proc.stdout + proc.stderr


def test_misspelt_platform_suggests_the_closest():
    proc = run_engine(["doctor", "--platform", "cpux"])
    assert proc.returncode != 0 and "Did you mean 'cpu'?" in proc.stdout + proc.stderr
