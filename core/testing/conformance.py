"""Conformance checks: one (op, implementation, case, dtype) at a time, against the reference."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.core.ops.registry import OPS, Case, Impl, KernelRegistry, OpDef


class ConformanceFailure(AssertionError):
    """An implementation disagreed with its op's reference."""


class Unsupported(Exception):
    """The implementation's supports() declined these inputs (the reason is the message)."""


@dataclass(frozen=True)
class Check:
    op: OpDef
    impl: Impl
    case: Case
    dtype: object

    @property
    def id(self) -> str:
        return f"{self.op.name}-{self.impl.qualname}-{self.case.name}-{_dtype_name(self.dtype)}"


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fresh_seed() -> int:
    """ENGINE_TEST_SEED if set, else a new random seed (printed so a failure can be replayed)."""
    env = os.environ.get("ENGINE_TEST_SEED")
    return int(env) if env else int.from_bytes(os.urandom(4), "little")


def collect_checks(registry: KernelRegistry, op_names=None, include_reference: bool = False) -> list[Check]:
    """Every registered implementation x case x claimed dtype of every (or each named) op."""
    checks = []
    for name in sorted(op_names or OPS):
        op = OPS[name]
        impls = registry.implementations(op) + ([op.reference_impl] if include_reference else [])
        for impl in impls:
            for case in op.cases:
                for dtype in case.dtypes or op.dtypes:
                    checks.append(Check(op, impl, case, dtype))
    return checks


def _clone(a):
    if isinstance(a, torch.Tensor):
        return a.clone()
    if isinstance(a, (list, tuple)):
        return type(a)(_clone(x) for x in a)
    return a


def _outputs(op: OpDef, args, result) -> list[torch.Tensor]:
    if op.mutates:
        return [args[i] for i in op.mutates]
    if isinstance(result, torch.Tensor):
        return [result]
    return list(result)


def _comparable(t: torch.Tensor) -> torch.Tensor:
    # float8 has no arithmetic on most backends; widen for the comparison.
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def compare(op: OpDef, dtype, got: list[torch.Tensor], want: list[torch.Tensor], context: str) -> float:
    """Assert ``got`` matches ``want`` within the op's tolerance for ``dtype``; return the max abs error."""
    tol = op.tolerances[dtype]
    if len(got) != len(want):
        raise ConformanceFailure(f"{context}: returned {len(got)} outputs, the reference {len(want)}")
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, torch.Tensor):
            raise ConformanceFailure(f"{context}: output {i} is a {type(g).__name__}, not a Tensor")
        if g.shape != w.shape or g.dtype != w.dtype:
            raise ConformanceFailure(f"{context}: output {i} is {tuple(g.shape)} {g.dtype}, "
                                     f"the reference gives {tuple(w.shape)} {w.dtype}")
        g, w = _comparable(g.cpu()), _comparable(w.cpu())
        try:
            torch.testing.assert_close(g, w, atol=tol.atol, rtol=tol.rtol, equal_nan=False)
        except AssertionError as exc:
            raise ConformanceFailure(f"{context}: output {i} differs from the reference "
                                     f"(atol={tol.atol}, rtol={tol.rtol}):\n{exc}") from None
        if g.is_floating_point() and g.numel():
            worst = max(worst, (g.double() - w.double()).abs().max().item())
    return worst


def run_check(check: Check, device, seed: int) -> float:
    """Run one check; returns the max abs error. Raises Unsupported or ConformanceFailure."""
    op, impl = check.op, check.impl
    gen = torch.Generator().manual_seed(seed)
    args = op.make_inputs(dict(check.case.params), check.dtype, device, gen)
    reason = impl.verdict(args)
    if reason is not None:
        raise Unsupported(f"{impl.qualname} declines {op.name} case {check.case.name!r}: {reason}")
    context = f"{check.id} (seed {seed}; replay with ENGINE_TEST_SEED={seed})"
    ref_args = _clone(args)
    impl_args = _clone(args)
    want = _outputs(op, ref_args, op.reference(*ref_args))
    got = _outputs(op, impl_args, impl.fn(*impl_args))
    return compare(op, check.dtype, got, want, context)
