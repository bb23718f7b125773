"""Plugin discovery and selection, with real Platform classes and real installed entry points."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

from engine.core import plugins
from engine.core.platform import Platform
from tests.plugin_helpers import default_platform, doctor_json, write_plugin_dist

IN_TREE = {"cpu", "cuda", "rocm", "xpu", "riscv", "ppc"}


def _platform(name: str, priority: int, available: bool = True):
    return type(f"P_{name}", (Platform,), {"name": name, "priority": priority,
                                           "probe": classmethod(lambda cls: (available, "test platform"))})


def _record(name, priority, available=True):
    cls = _platform(name, priority, available)
    return plugins.PluginRecord(name, f"test:{name}", None, cls, available, "test platform")


def test_all_in_tree_plugins_are_entry_points():
    names = {ep.name for ep in metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)}
    assert IN_TREE <= names


def test_discovery_here_selects_cpu_and_explains_the_rest():
    """Without an accelerator (CI) only cpu is available and selected; on a GPU machine its platform wins."""
    records = {r.name: r for r in plugins.discover()}
    assert records["cpu"].available
    for name in IN_TREE - {"cpu"}:
        assert records[name].available or records[name].reason, f"{name} gives no reason"
        assert records[name].error is None, records[name].error
    available = [r for r in records.values() if r.available]
    if not torch.accelerator.is_available():
        assert [r.name for r in available if r.name in IN_TREE] == ["cpu"], available
    assert plugins.select(list(records.values())).name == max(available, key=lambda r: r.priority).name


def test_highest_priority_wins():
    recs = [_record("low", 1), _record("high", 50), _record("off", 99, available=False)]
    assert plugins.select(recs).name == "high"


def test_tie_is_an_error_naming_both():
    recs = [_record("alpha", 7), _record("beta", 7), _record("low", 1)]
    with pytest.raises(plugins.PlatformError, match=r"'alpha' and 'beta'.*ENGINE_PLATFORM"):
        plugins.select(recs)
    assert plugins.select(recs, "beta").name == "beta"


def test_forcing_unknown_suggests_closest():
    with pytest.raises(plugins.PlatformError, match=r"unknown platform 'cpux'.*Did you mean 'cpu'"):
        plugins.select(plugins.discover(), "cpux")


def test_forcing_unavailable_says_why():
    with pytest.raises(plugins.PlatformError, match=r"'rocm' was forced but is not available here: .*ROCm"):
        plugins.select(plugins.discover(), "rocm")


def test_no_available_platform_is_an_error():
    with pytest.raises(plugins.PlatformError, match="no platform is available"):
        plugins.select([_record("off", 5, available=False)])


def test_entry_point_name_must_match_class_name(tmp_path):
    site = write_plugin_dist(tmp_path, "misnamed-plugin", "goodname", "misnamed_mod", """
        from engine.core.platform import Platform
        class P(Platform):
            name = "othername"
            priority = 1
            @classmethod
            def probe(cls):
                return True, "here"
        """, "P")
    plugin = next(p for p in doctor_json(site)["plugins"] if p["name"] == "goodname")
    assert not plugin["available"] and "must match" in plugin["reason"]


def test_plugin_raising_on_import_is_reported_and_others_work(tmp_path):
    site = write_plugin_dist(tmp_path, "broken-plugin", "broken", "broken_plugin_mod",
                             "raise ImportError('vendor driver libfoo.so not found')\n", "BrokenPlatform")
    info = doctor_json(site)
    assert info["_returncode"] == 0, info["_stderr"]
    broken = next(p for p in info["plugins"] if p["name"] == "broken")
    assert not broken["available"]
    assert "libfoo.so not found" in broken["reason"]
    assert "Traceback" in broken["error"] and broken["distribution"] == "broken-plugin"
    assert info["selected"] == default_platform() and info["ops"]


def test_plugin_raising_in_probe_is_reported(tmp_path):
    site = write_plugin_dist(tmp_path, "probe-raises", "flaky", "flaky_mod", """
        from engine.core.platform import Platform
        class Flaky(Platform):
            name = "flaky"
            priority = 1000
            @classmethod
            def probe(cls):
                raise RuntimeError("device query failed")
        """, "Flaky")
    info = doctor_json(site)
    flaky = next(p for p in info["plugins"] if p["name"] == "flaky")
    assert "probe raised RuntimeError: device query failed" in flaky["reason"]
    assert info["selected"] == default_platform()
