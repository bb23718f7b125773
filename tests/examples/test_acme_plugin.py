"""The out-of-tree example plugin (examples/acme-plugin), pip-installed as a vendor would ship it."""

from __future__ import annotations

from tests.plugin_helpers import default_platform, doctor_json, run_engine


def test_example_is_discovered_but_not_selected_by_default(acme_site):
    info = doctor_json(acme_site)
    acme = next(p for p in info["plugins"] if p["name"] == "acme")
    assert acme["available"] and acme["distribution"] == "engine-acme-plugin"
    assert info["selected"] == default_platform()  # its priority (5) is below cpu's (10)


def test_example_forced_uses_its_override(acme_site):
    info = doctor_json(acme_site, {"ENGINE_PLATFORM": "acme"})
    assert info["selected"] == "acme"
    assert info["ops"]["rms_norm"]["dtypes"]["float32"]["chosen"] == "acme.acme_rms_norm"
    # its supports() declines fp16, so dispatch falls back and doctor says why
    fp16 = info["ops"]["rms_norm"]["dtypes"]["float16"]
    assert fp16["chosen"] != "acme.acme_rms_norm"
    assert any("not torch.float16" in o["why_not"] for o in fp16["others"])


def test_example_selected_by_priority(acme_site):
    # 500: above every in-tree platform's priority (cuda and rocm have 100), not only cpu's
    assert doctor_json(acme_site, {"ACME_PRIORITY": "500"})["selected"] == "acme"


def test_example_passes_the_conformance_kit(acme_site):
    proc = run_engine(["--pyargs", "engine.core.testing", "--engine-platform", "acme", "-v", "-p", "no:cacheprovider",
                       "-o", "addopts=", "--engine-op", "rms_norm"], acme_site, module="pytest")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "engine conformance kit: platform=acme" in proc.stdout
    assert "rms_norm-acme.acme_rms_norm-smollm-float32] PASSED" in proc.stdout
    assert "rms_norm-acme.acme_rms_norm-smollm-bfloat16] PASSED" in proc.stdout
