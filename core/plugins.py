"""Platform plugin discovery and selection.

Every platform, in-tree or a vendor's, is an entry point in the group ``engine.platforms`` whose
value is a :class:`~engine.core.platform.Platform` subclass. Discovery loads and probes each one
and keeps a :class:`PluginRecord` of the verdict; a plugin that raises on import or probe is
recorded with its traceback and never takes the others down.

Selection: ``ENGINE_PLATFORM=<name>`` (or an explicit name) forces a platform and fails loudly
when it is unknown (suggesting the closest name) or unavailable (saying why). Otherwise the
available platform of highest priority wins; a tie is an error that names both.
"""

from __future__ import annotations

import difflib
import os
import traceback
from dataclasses import dataclass
from importlib import metadata

from .ops.registry import OPS, KernelRegistry, set_active_registry
from .platform import Platform

ENTRY_POINT_GROUP = "engine.platforms"
ENV_VAR = "ENGINE_PLATFORM"


class PlatformError(RuntimeError):
    """No usable platform could be selected; the message says what to do."""


@dataclass
class PluginRecord:
    name: str
    target: str  # "module:attr" of the entry point
    distribution: str | None
    platform_cls: type[Platform] | None = None
    available: bool = False
    reason: str = ""
    error: str | None = None  # traceback text when the plugin raised

    @property
    def priority(self) -> int | None:
        return self.platform_cls.priority if self.platform_cls is not None else None

    def as_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "distribution": self.distribution,
                "available": self.available, "priority": self.priority, "reason": self.reason,
                "error": self.error}


def _entry_points():
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


def _load(ep) -> PluginRecord:
    dist = getattr(getattr(ep, "dist", None), "name", None)
    rec = PluginRecord(ep.name, ep.value, dist)
    try:
        cls = ep.load()
    except BaseException as exc:  # SystemExit or KeyboardInterrupt from a plugin must not kill discovery
        if isinstance(exc, KeyboardInterrupt):
            raise
        rec.reason = f"failed to import: {type(exc).__name__}: {exc}"
        rec.error = traceback.format_exc()
        return rec
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        rec.reason = f"entry point {ep.value!r} is not a engine.core.platform.Platform subclass"
        return rec
    rec.platform_cls = cls
    if cls.name != ep.name:
        rec.reason = f"entry point is named {ep.name!r} but the class says name={cls.name!r}; they must match"
        return rec
    try:
        ok, reason = cls.probe()
    except Exception as exc:
        rec.reason = f"probe raised {type(exc).__name__}: {exc}"
        rec.error = traceback.format_exc()
        return rec
    rec.available, rec.reason = bool(ok), str(reason)
    return rec


def discover(entry_points=None) -> list[PluginRecord]:
    """Load and probe every plugin; one record per entry point, sorted by name."""
    eps = _entry_points() if entry_points is None else entry_points
    records = [_load(ep) for ep in eps]
    return sorted(records, key=lambda r: r.name)


def select(records: list[PluginRecord], forced: str | None = None) -> PluginRecord:
    """Choose the platform (see module docstring). Raises PlatformError with an actionable message."""
    by_name = {r.name: r for r in records}
    if forced:
        rec = by_name.get(forced)
        if rec is None:
            close = difflib.get_close_matches(forced, list(by_name), n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise PlatformError(
                f"unknown platform {forced!r} (from {ENV_VAR} or --platform).{hint} "
                f"Installed platforms: {', '.join(sorted(by_name)) or 'none'}.")
        if not rec.available:
            usable = [r.name for r in records if r.available]
            raise PlatformError(
                f"platform {forced!r} was forced but is not available here: {rec.reason}. "
                f"Available platforms: {', '.join(usable) or 'none'}; unset {ENV_VAR} to pick automatically.")
        return rec
    usable = [r for r in records if r.available]
    if not usable:
        details = "; ".join(f"{r.name}: {r.reason}" for r in records) or "no plugins are installed"
        raise PlatformError(f"no platform is available ({details}). Reinstall engine or install a plugin.")
    top = max(r.priority for r in usable)
    best = [r for r in usable if r.priority == top]
    if len(best) > 1:
        names = " and ".join(repr(r.name) for r in best)
        raise PlatformError(
            f"platforms {names} are both available with priority {top}; "
            f"set {ENV_VAR} to one of them to choose.")
    return best[0]


_STATE: dict = {}


def activate(name: str | Platform | None = None, records: list[PluginRecord] | None = None) -> Platform:
    """Select a platform (``name``, else $ENGINE_PLATFORM, else by priority), build its kernel
    registry, and make it the one ops dispatch to. Returns the platform instance.

    ``name`` may also be a Platform instance (a vendor's or a test's, not installed as an entry point):
    it is used as it is."""
    if isinstance(name, Platform):
        platform = name
        records = [] if records is None else records
    else:
        records = discover() if records is None else records
        rec = select(records, name or os.environ.get(ENV_VAR) or None)
        platform = rec.platform_cls()
    registry = build_registry(platform)
    set_active_registry(registry)
    _STATE.update(platform=platform, records=records, registry=registry)
    return platform


def build_registry(platform: Platform) -> KernelRegistry:
    registry = KernelRegistry(platform.name)
    try:
        platform.register_kernels(registry)
    except Exception as exc:
        raise PlatformError(
            f"platform {platform.name!r} failed to register its kernels: {type(exc).__name__}: {exc}. "
            f"Set {ENV_VAR} to another platform, or reinstall the plugin.") from exc
    for op in OPS.values():  # a collective's reference is the backend's own (NCCL, gloo, ...): a real implementation
        if op.collective and not registry.implementations(op) and registry.reference_only_reason(op) is None:
            registry.reference_only(op, f"torch.distributed's {op.name} over the platform's {platform.dist_backend!r} "
                                        "backend")
    return registry


def current_platform() -> Platform:
    """The active platform, activating the default one on first use."""
    if "platform" not in _STATE:
        activate()
    return _STATE["platform"]


def current_records() -> list[PluginRecord]:
    if "records" not in _STATE:
        activate()
    return _STATE["records"]
