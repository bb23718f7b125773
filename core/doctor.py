"""``engine doctor``: every plugin with its verdict, the selected platform, and each op's kernel choice."""

from __future__ import annotations

import platform as _pyplatform
import sys

import torch

from . import plugins
from .ops.registry import OPS, KernelRegistry


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def op_choices(registry: KernelRegistry, device) -> dict:
    """For each op and claimed dtype: the implementation chosen on the op's first case, and why not the others."""
    out = {}
    for name in sorted(OPS):
        op = OPS[name]
        per_dtype = {}
        for dtype in op.dtypes:
            case = next((c for c in op.cases if c.dtypes is None or dtype in c.dtypes), op.cases[0])
            try:
                args = op.make_inputs(dict(case.params), dtype, device, torch.Generator().manual_seed(0))
            except Exception as exc:
                per_dtype[_dtype_name(dtype)] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            explained = registry.explain(op, args)
            chosen = next(i for i, why in explained if why is None)
            others = []
            for impl, why in explained:
                if impl is chosen:
                    continue
                others.append({"impl": impl.qualname, "priority": impl.priority,
                               "why_not": why or f"lower priority than {chosen.qualname}"})
            per_dtype[_dtype_name(dtype)] = {"chosen": chosen.qualname, "priority": chosen.priority,
                                             "case": case.name, "others": others}
            declared = registry.reference_only_reason(op, dtype)
            if declared and chosen is op.reference_impl:
                per_dtype[_dtype_name(dtype)]["reference_only"] = declared
        skipped = [{"impl": f"{s.platform}.{s.name}", "why_not": s.reason} for s in registry.skipped(op)]
        out[name] = {"dtypes": per_dtype, "not_registered": skipped}
    return out


def report(forced: str | None = None) -> tuple[dict, str | None]:
    """The doctor's findings as a dict, and the selection error (None when a platform was selected)."""
    records = plugins.discover()
    info: dict = {
        "engine": _version(), "torch": torch.__version__, "python": _pyplatform.python_version(),
        "machine": _pyplatform.machine(), "plugins": [r.as_dict() for r in records],
        "forced": forced, "selected": None,
    }
    try:
        rec = plugins.select(records, forced)
        platform = rec.platform_cls()
        registry = plugins.build_registry(platform)
    except plugins.PlatformError as exc:
        return info, str(exc)
    info["selected"] = platform.name
    info["selected_because"] = (f"forced by {plugins.ENV_VAR}/--platform" if forced
                                else "highest priority among available platforms")
    info["device"] = platform.facts()
    extra = getattr(platform, "doctor_facts", None)
    if extra is not None:
        info["device"].update(extra())
    info["ops"] = op_choices(registry, platform.device())
    return info, None


def _version() -> str:
    from engine import __version__

    return __version__


def format_text(info: dict, error: str | None) -> str:
    lines = [f"engine {info['engine']}  torch {info['torch']}  python {info['python']}  ({info['machine']})", "",
             f"Plugins (entry-point group {plugins.ENTRY_POINT_GROUP}):"]
    for p in info["plugins"]:
        mark = "*" if p["name"] == info["selected"] else " "
        verdict = "available" if p["available"] else ("ERROR" if p["error"] else "unavailable")
        prio = "-" if p["priority"] is None else p["priority"]
        lines.append(f" {mark} {p['name']:<10} priority {prio!s:<4} {verdict:<11} {p['reason']}")
        if p["distribution"] not in (None, "engine"):
            lines.append(f"     from distribution {p['distribution']} ({p['target']})")
        if p["error"]:
            lines.extend("     | " + t for t in p["error"].rstrip().splitlines()[-6:])
    lines.append("")
    if error:
        lines.append(f"error: {error}")
        return "\n".join(lines)
    lines.append(f"Selected platform: {info['selected']} ({info['selected_because']})")
    lines.extend(f"  {k}: {v}" for k, v in info["device"].items())
    lines += ["", "Ops (implementation chosen for each claimed dtype on the op's first conformance case):"]
    for name, op in info["ops"].items():
        for dtype, c in op["dtypes"].items():
            if "error" in c:
                lines.append(f"  {name:<26} {dtype:<9} input generator failed: {c['error']}")
                continue
            lines.append(f"  {name:<26} {dtype:<9} -> {c['chosen']}"
                         + (f" (reference-only on purpose: {c['reference_only']})" if c.get("reference_only") else ""))
            lines.extend(f"  {'':<36} not {o['impl']}: {o['why_not']}" for o in c["others"])
        lines.extend(f"  {name:<26} {'':<9}    not registered: {s['impl']}: {s['why_not']}"
                     for s in op["not_registered"])
    return "\n".join(lines)


def main(forced: str | None, as_json: bool, model: str | None = None, dtype: str = "bfloat16") -> int:
    """The platform report; with ``model``, also what that checkpoint becomes in memory (loader/describe.py)."""
    import json

    info, error = report(forced)
    if model is not None:
        from .loader import ModelLoadError
        from .loader.describe import describe

        try:
            info["model"] = describe(model, getattr(torch, dtype))
        except ModelLoadError as exc:
            info["model"] = {"error": str(exc)}
            error = error or str(exc)
    if as_json:
        info["error"] = error
        print(json.dumps(info, indent=2, default=str))
    else:
        text = format_text(info, error if model is None or "error" not in info.get("model", {}) else None)
        if model is not None:
            from .loader.describe import format_summary

            text += "\n\n" + ("\n".join(format_summary(info["model"])) if "error" not in info["model"]
                                else f"Model: error: {info['model']['error']}")
        print(text, file=sys.stdout)
    return 2 if error else 0
