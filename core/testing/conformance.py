"""Conformance checks: one (op, implementation, case, dtype) at a time, against the reference."""

from __future__ import annotations

import os
import random
import zlib
from dataclasses import dataclass

import torch

from engine.core.ops.registry import OPS, Case, Impl, KernelRegistry, OpDef

from .oracle import envelope_violations, widen

ROUNDED_DTYPES = (torch.bfloat16, torch.float16)
MAX_ROUNDING_MISMATCH = 0.01


class ConformanceFailure(AssertionError):
    """An implementation disagreed with its op's reference."""


class Unsupported(Exception):
    """The implementation's supports() declined these inputs (the reason is the message)."""


@dataclass(frozen=True)
class Check:
    """One (op, implementation, case, dtype); ``strided`` hands the implementation non-contiguous views of the
    inputs it only reads (same values), which it must compute on correctly or decline in ``supports``."""

    op: OpDef
    impl: Impl
    case: Case
    dtype: object
    strided: bool = False

    @property
    def id(self) -> str:
        return (f"{self.op.name}-{self.impl.qualname}-{self.case.name}-{dtype_name(self.dtype)}"
                + ("-strided" if self.strided else ""))


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fresh_seed() -> int:
    """ENGINE_TEST_SEED if set, else a new random seed (printed so a failure can be replayed)."""
    env = os.environ.get("ENGINE_TEST_SEED")
    return int(env) if env else int.from_bytes(os.urandom(4), "little")


# The most multiply-adds (or elements touched) one drawn case may cost: the host computes the reference and its fp64
# twin for every case, so a CPU run draws real sizes one or two dimensions at a time; an accelerator runs the
# references on the device and takes whole real shapes.
HOST_BUDGET = 1 << 27
DEVICE_BUDGET = 1 << 34


def budget_for(device) -> int:
    return HOST_BUDGET if torch.device(device).type == "cpu" else DEVICE_BUDGET


def op_cases(op: OpDef, seed: int | None, budget: int = HOST_BUDGET) -> list[Case]:
    """The op's fixed cases, then the ones its shape generator draws for ``seed`` (the same for every process of a
    run: the draw is seeded by the run's seed and the op's name)."""
    cases = list(op.cases)
    if op.draw is not None and seed is not None:
        drawn = op.draw(random.Random(f"{seed}:{op.name}"), budget)
        names = [c.name for c in cases + drawn]
        if len(set(names)) != len(names):
            raise ValueError(f"{op.name}: drawn case names collide: {names}")
        cases += drawn
    return cases


def ops_without_kernel(registry: KernelRegistry, op_names=None) -> list[str]:
    return [name for name in sorted(op_names or OPS) if not registry.implementations(name)]


def collect_checks(registry: KernelRegistry, op_names=None, include_reference: bool = False,
                   strided: bool = True, seed: int | None = None, budget: int = HOST_BUDGET) -> list[Check]:
    """Every registered implementation x case x dtype of every (or each named) op, contiguous and strided; with a
    ``seed``, the cases include the ones each op's generator draws for it.

    An op the platform has no kernel for is checked through its reference, run on the platform's device and
    compared with the reference on the host: the run still says whether the device computes the op right."""
    checks = []
    for name in sorted(op_names or OPS):
        op = OPS[name]
        impls = registry.implementations(op)
        if not impls or include_reference:
            impls = impls + [op.reference_impl]
        cases = op_cases(op, seed, budget)
        for impl in impls:
            for case in cases:
                for dtype in case.dtypes or op.dtypes:
                    checks.append(Check(op, impl, case, dtype))
                    if strided and impl is not op.reference_impl:
                        checks.append(Check(op, impl, case, dtype, strided=True))
    return checks


def supports_verdict(impl: Impl, args, context: str) -> str | None:
    """None when ``impl`` accepts ``args``, else its reason; a supports() that raises is a failure."""
    if impl.supports is None:
        return None
    try:
        ok = impl.supports(*args)
    except Exception as exc:
        raise ConformanceFailure(f"{context}: supports() raised {type(exc).__name__}: {exc}; it must return True "
                                 "or a short reason, never raise") from exc
    if ok is True:
        return None
    return ok if isinstance(ok, str) and ok else "supports() returned False"


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


def compare(op: OpDef, dtype, got: list[torch.Tensor], want: list[torch.Tensor], context: str,
            declared: bool = True) -> float:
    """Assert ``got`` matches ``want`` (shapes, dtypes, rounding, and with ``declared`` the values within the op's
    declared tolerance for ``dtype``); return the max abs error. The kit checks values against the bound derived
    from the reference's own error instead (``run_check``), except for exact ops."""
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
        if declared or not g.is_floating_point():
            try:
                torch.testing.assert_close(g, w, atol=tol.atol, rtol=tol.rtol, equal_nan=False)
            except AssertionError as exc:
                raise ConformanceFailure(f"{context}: output {i} differs from the reference beyond the op's "
                                         f"declared tolerance (atol={tol.atol}, rtol={tol.rtol}):\n{exc}") from None
        if g.is_floating_point() and g.numel():
            worst = max(worst, (g.double() - w.double()).abs().max().item())
        if op.rounded_outputs and dtype in ROUNDED_DTYPES and g.dtype == dtype and g.numel() >= 64:
            off = _rounding_mismatch(g, w)
            if off > MAX_ROUNDING_MISMATCH:
                raise ConformanceFailure(
                    f"{context}: output {i} differs from the correctly rounded reference in {off:.1%} of its "
                    f"elements (at most {MAX_ROUNDING_MISMATCH:.0%} may, where fp32 evaluation order tips a "
                    "rounding); is it truncated instead of rounded to nearest, or computed in low precision?")
    return worst


def _rounding_mismatch(g: torch.Tensor, w: torch.Tensor) -> float:
    """The fraction of elements whose bits differ from the correctly rounded reference, among those that matter to
    their row (at least 2^-10 of its largest magnitude: a value underflowing next to huge ones in a special row may
    come from an exp approximated to a relative 1e-4 and still be right to the row's precision)."""
    rows_w = w.float().reshape(-1, w.shape[-1]) if w.dim() else w.float().reshape(1, 1)
    big = rows_w.abs() >= rows_w.abs().amax(-1, keepdim=True) * 2.0 ** -10
    diff = (_bits(g) != _bits(w)).reshape(rows_w.shape)
    return diff[big].float().mean().item() if bool(big.any()) else 0.0


def _strided(a):
    """The same values in a non-contiguous view at an offset: every other element of a buffer twice as wide, from
    its second element (a kernel that ignores strides or the storage offset reads the wrong values)."""
    if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.numel() > 1:
        wide = torch.empty((*a.shape[:-1], 2 * a.shape[-1] + 1), dtype=a.dtype, device=a.device)
        view = wide[..., 1::2]
        view.copy_(a)
        return view
    return a


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().cpu().contiguous().view(ints[t.element_size()]) if t.element_size() in ints else t.cpu()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


@dataclass
class Outcome:
    """One check computed: the kernel's outputs, the reference's, the fp64 oracle's (None for exact ops) and the op's
    error scale on these inputs."""

    context: str
    got: list
    want: list
    oracle: list | None
    term_scale: float

    def floating(self):
        """(index, got, want, oracle) of the outputs judged against the derived bound."""
        return [(i, g, w, o) for i, (g, w, o) in enumerate(zip(self.got, self.want, self.oracle, strict=True))
                if g.is_floating_point() and g.element_size() > 1]


def evaluate(check: Check, device, seed: int) -> Outcome:
    """Draw the check's inputs and compute the kernel, the reference and (for inexact ops) the fp64 oracle. Raises
    Unsupported when the kernel declines the inputs, ConformanceFailure when it writes an argument it may not."""
    op, impl = check.op, check.impl
    # Every check draws its own values (a kernel that returns a result remembered per shape must not pass).
    gen = torch.Generator().manual_seed(seed ^ zlib.crc32(check.id.encode()))
    args = op.make_inputs(dict(check.case.params), check.dtype, device, gen)
    context = f"{check.id} (seed {seed}; replay with ENGINE_TEST_SEED={seed})"
    if check.strided:
        args = tuple(a if i in op.mutates else _strided(a) for i, a in enumerate(args))
    reason = supports_verdict(impl, args, context)
    if reason is not None:
        raise Unsupported(f"{impl.qualname} declines {op.name} case {check.case.name!r}"
                          f"{' (strided inputs)' if check.strided else ''}: {reason}")
    pristine = _clone(args)
    # The reference reads contiguous inputs; run on the host when the check is of the reference itself.
    ref_args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in _clone(args))
    if impl is op.reference_impl:
        ref_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in ref_args)
    impl_args = _clone(args) if not check.strided else tuple(
        _strided(a) if isinstance(a, torch.Tensor) and not a.is_contiguous() else _clone(a) for a in args)
    # widened (copied) before the reference runs: a reference that writes its outputs in place must not feed them
    oracle_args = widen(ref_args, check.dtype) if _derived(op, check.dtype) else None
    scale = float(op.error_scale(*ref_args)) if op.error_scale is not None else 0.0
    want = _outputs(op, ref_args, op.reference(*ref_args))
    got = _outputs(op, impl_args, impl.fn(*impl_args))
    for i, (before, after) in enumerate(zip(pristine, impl_args, strict=True)):
        if i not in op.mutates and isinstance(before, torch.Tensor) and not _same_bits(before, after):
            raise ConformanceFailure(f"{context}: argument {i} was modified; only arguments {list(op.mutates)} "
                                     "may be written")
    oracle = None
    if oracle_args is not None:
        try:
            oracle = _outputs(op, oracle_args, op.reference(*oracle_args))
        except Exception as exc:
            raise RuntimeError(f"{context}: the reference of {op.name} cannot run on float64 inputs, which the kit "
                               f"needs for its error bound: {type(exc).__name__}: {exc}") from exc
    return Outcome(context, got, want, oracle, scale)


def run_check(check: Check, device, seed: int) -> float:
    """Run one check; returns the max abs error. Raises Unsupported or ConformanceFailure."""
    op = check.op
    out = evaluate(check, device, seed)
    worst = compare(op, check.dtype, out.got, out.want, out.context, declared=out.oracle is None)
    if out.oracle is not None:
        for i, g, w, o in out.floating():
            why = envelope_violations(g, w, o, op.quantizes_intermediates, op.tolerances[check.dtype],
                                      out.term_scale, op.accumulation_roundoff)
            if why:
                raise ConformanceFailure(f"{out.context}: output {i} {tuple(g.shape)}: {why}\ncase params: "
                                         f"{params_text(check.case)}")
    return worst


def _derived(op: OpDef, dtype) -> bool:
    """Exact ops (copies, quantizers: declared tolerance 0) are compared bit for bit; the rest against the bound
    derived from the reference's own error (oracle.py)."""
    tol = op.tolerances[dtype]
    return bool(tol.atol or tol.rtol)


def params_text(case: Case) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.params.items())
