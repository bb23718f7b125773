"""Coverage: which of a platform's kernels take which cases, and the failures that makes.

For every (op, dtype) the platform claims (its ``supported_dtypes()`` that the op has), the kit asks each registered
kernel's ``supports()`` about every case (the fixed ones and those drawn this run) and fails the platform when

* no kernel claims the dtype, unless the platform declared the op reference-only on purpose
  (``registry.reference_only(op, reason)``): a plugin that registers nothing must not pass by comparing the
  reference with itself;
* a kernel that claims the dtype takes none of its cases: a registration that can never run;
* an engine-shape case (a size and layout the engine sends) is taken by none of the platform's kernels: there the
  engine would run the slow reference while the kit reported the kernels conformant.

The fraction of cases each kernel took is reported per op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.ops.registry import OPS, Impl, KernelRegistry, OpDef

from .conformance import ConformanceFailure, dtype_name, op_cases, params_text, supports_verdict


@dataclass(frozen=True)
class Coverage:
    """One (op, dtype) a platform claims, the kernels that claim it, and the reason if it is reference-only."""

    op: OpDef
    dtype: object
    impls: tuple
    reference_only: str | None = None

    @property
    def id(self) -> str:
        return f"{self.op.name}-{dtype_name(self.dtype)}-served"


def claims(impl: Impl, op: OpDef, platform_dtypes) -> tuple:
    """The dtypes ``impl`` claims: those it registered with, else every dtype of its op the platform supports."""
    return tuple(impl.dtypes) if impl.dtypes is not None else tuple(d for d in op.dtypes if d in platform_dtypes)


def collect_coverage(registry: KernelRegistry, platform_dtypes, op_names=None) -> list[Coverage]:
    out = []
    for name in sorted(op_names or OPS):
        op = OPS[name]
        impls = registry.implementations(op)
        dtypes = [d for d in op.dtypes if d in platform_dtypes]
        dtypes += [d for i in impls for d in claims(i, op, platform_dtypes) if d in op.dtypes and d not in dtypes]
        for dtype in dtypes:
            mine = tuple(i for i in impls if dtype in claims(i, op, platform_dtypes))
            out.append(Coverage(op, dtype, mine, registry.reference_only_reason(op, dtype)))
    return out


def platform_facts(platform) -> dict:
    """The facts a case's ``needs`` are matched against (Case.needs)."""
    return {"fp8": {torch.float8_e4m3fnuz: "e4m3fnuz"}.get(platform.fp8_dtype(), "e4m3fn")}


def run_coverage(cov: Coverage, device, seed: int | None, budget: int, facts: dict | None = None) -> dict[str, float]:
    """Check ``cov`` (module docstring); returns {kernel: fraction of the cases it takes}, or {} when the op is
    reference-only by declaration or a collective (its kernels need several ranks: the two-process check in
    distributed.py serves them and fails one that takes no case). A case is an engine shape here if it is one and
    its ``needs`` match ``facts`` (the platform's, :func:`platform_facts`). Raises ConformanceFailure."""
    facts = facts if facts is not None else {"fp8": "e4m3fn"}
    op, dtype = cov.op, cov.dtype
    if op.collective and cov.impls:  # served across ranks: distributed.py requires each kernel to take cases there
        return {}
    if not cov.impls:
        if cov.reference_only:
            return {}
        raise ConformanceFailure(
            f"no kernel for {op.name} in {dtype_name(dtype)}: the platform claims {dtype_name(dtype)} (its "
            f"supported_dtypes()) and registers no {op.name} implementation that does, so the engine would run the "
            f"plain-torch reference. Register a kernel (registry.register({op.name!r}, ...)), or declare the op "
            f"reference-only on purpose: registry.reference_only({op.name!r}, 'why')")
    cases = [c for c in op_cases(op, seed, budget) if dtype in (c.dtypes or op.dtypes)]
    gen = torch.Generator().manual_seed(seed or 0)
    taken = [0] * len(cov.impls)
    unserved = []
    for case in cases:
        args = op.make_inputs(dict(case.params), dtype, device, gen)
        verdicts = [(impl, supports_verdict(impl, args, f"{cov.id} case {case.name!r}")) for impl in cov.impls]
        for j, (_, why) in enumerate(verdicts):
            taken[j] += why is None
        engine_shape = case.engine_shape and all(facts.get(k) == v for k, v in case.needs.items())
        if engine_shape and all(why is not None for _, why in verdicts):
            reasons = "; ".join(f"{i.qualname}: {w}" for i, w in verdicts)
            unserved.append(f"{case.name} ({params_text(case)}): {reasons}")
    never = [impl for impl, n in zip(cov.impls, taken, strict=True) if n == 0]
    if never:
        raise ConformanceFailure(
            f"{', '.join(i.qualname for i in never)} claims {dtype_name(dtype)} for {op.name} but declines every one "
            f"of its {len(cases)} cases: a registration that never runs. Accept the shapes the engine sends, or "
            "register it with dtypes=... naming only what it computes (or registry.skip(...) with the reason)")
    if unserved and not cov.reference_only:
        raise ConformanceFailure(
            f"{len(unserved)} of the engine-shape cases of {op.name} in "
            f"{dtype_name(dtype)} are taken by none of the platform's kernels, so the engine would run the "
            "reference there: " + " | ".join(unserved))
    return {impl.qualname: n / max(len(cases), 1) for impl, n in zip(cov.impls, taken, strict=True)}


def format_coverage(table: dict[str, dict[str, float]]) -> list[str]:
    """Report lines: per (op, dtype), the fraction of cases each kernel took."""
    lines = []
    for key in sorted(table):
        row = table[key]
        lines.append(f"  {key}: " + (", ".join(f"{k} {v:.0%}" for k, v in row.items()) or "reference (declared)"))
    return lines
