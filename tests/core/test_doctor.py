"""``engine doctor``: the plugin table, the selection, the op table, and its exit codes."""

from __future__ import annotations

import pytest

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


@pytest.mark.usefixtures("default_model")
def test_doctor_describes_a_model_what_stays_quantized_and_its_memory(tmp_path):
    """--model: the built-in GGUF model's Q4_1/Q8_0 matrices kept in their blocks, and an HF NVFP4 checkpoint's
    matrices kept in NVFP4, each with its memory and the loader's own line; a missing model exits 2 saying why."""
    import json

    from tests.core.loader.test_hf_nvfp4 import write

    proc = run_engine(["doctor", "--model", "default", "--dtype", "float32"])
    assert proc.returncode == 0, proc.stderr
    assert "GGUF Q4_1 blocks: 210 tensors" in proc.stdout and "KV cache: 3 KV heads x 64" in proc.stdout
    write(tmp_path, "NVFP4", True, "hf_quant_config.json")
    proc = run_engine(["doctor", "--model", str(tmp_path), "--json"])
    model = json.loads(proc.stdout)["model"]
    assert model["weights"]["NVFP4 (e2m1, e4m3 scales per 16)"]["tensors"] == 14
    assert any("modelopt checkpoint; 14 matrices kept quantized" in m for m in model["messages"])
    proc = run_engine(["doctor", "--model", str(tmp_path / "nope")])
    assert proc.returncode == 2 and "does not exist" in proc.stdout


def test_a_command_line_load_says_what_it_kept_quantized(tmp_path):
    from tests.core.loader.test_hf_nvfp4 import write

    write(tmp_path, "NVFP4", False, "config.json")
    proc = run_engine(["generate", "--model", str(tmp_path), "--no-chat", "--max-tokens", "2", "w1 w2"])
    assert proc.returncode == 0, proc.stderr
    assert "modelopt checkpoint; 14 matrices kept quantized" in proc.stderr
    proc = run_engine(["generate", "--model", str(tmp_path), "--no-chat", "--max-tokens", "2", "w1 w2"],
                      env={"ENGINE_LOG_LEVEL": "WARNING"})
    assert proc.returncode == 0 and "kept quantized" not in proc.stderr
