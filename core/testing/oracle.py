"""The kit's error bound, derived from the reference's own error against an fp64 computation.

For an op whose declared tolerance is not exact, every check computes three results from the same inputs:

* ``oracle``: the reference run on the inputs widened to float64 (and asked for a float64 output), so it
  accumulates in fp64 and rounds nothing to the check's dtype: the best answer the specification gives;
* ``want``: the reference run as the kernel is, in the check's dtype (fp32 accumulation, outputs rounded);
* ``got``: the kernel's result.

A kernel may err from the oracle by at most ``ENVELOPE`` times what the reference errs, measured per output row
(the last dimension) and over the whole output:

    per row r:   max_j |got - oracle|  <=  ENVELOPE * (max_j |want - oracle| + u * max_j |oracle|)
    whole:       ||got - oracle||_2    <=  ENVELOPE * (||want - oracle||_2 + u * ||oracle||_2)

where ``ENVELOPE * u`` is ``ROUNDINGS[dtype]`` units of rounding of the output's dtype. The row
bound scales with each row's own magnitude (a row of huge values does not hide an error in a row of small ones);
the whole-tensor bound catches systematic errors (a scale off by a few per cent) that stay under the per-element
bound of a low-precision dtype. An op that quantizes an intermediate (``OpDef.quantizes_intermediates``) may have a
few rows (at most 1 in 64, and at least one) outside the row bound, each within the op's declared tolerance, and
those rows are left out of the whole-tensor bound: a kernel that sums in another order may round one activation to
the neighbouring FP8 or int8 step, which moves that row.
"""

from __future__ import annotations

import torch

# How many times the reference's own error a kernel may make, plus how many roundings of the row's largest value.
# A bf16/fp16 output is dominated by its own final rounding (one, and one more for slack). An fp32 output carries the
# summation order of long reductions: a kernel that factors a block scale out of its dot products, or sums in
# another order, measured up to 13 roundings of the row maximum where the reference (blocked BLAS) made 2.
ENVELOPE = 4.0
ROUNDINGS = {torch.float32: 32.0, torch.bfloat16: 2.0, torch.float16: 2.0}
WIDE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0, times the roundings a kernel may add (ROUNDINGS) over ENVELOPE."""
    return torch.finfo(dtype).eps / 2 * ROUNDINGS.get(dtype, 2.0) / ENVELOPE


def widen(args, dtype):
    """The oracle's arguments: float tensors of fp32/bf16/fp16 as float64 (same values), and a dtype argument equal to
    the check's dtype (an ``out_dtype``) as float64. Quantized tensors (fp8, packed integers) stay as they are."""
    def one(a):
        if isinstance(a, torch.Tensor) and a.dtype in WIDE_DTYPES:
            return a.detach().cpu().contiguous().double()
        if isinstance(a, torch.Tensor):
            return a.detach().cpu().contiguous()
        if isinstance(a, torch.dtype) and a == dtype:
            return torch.float64
        if isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        return a
    return tuple(one(a) for a in args)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.double()
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1]) if t.shape[-1] else t.reshape(-1, 1)


def envelope_violations(got: torch.Tensor, want: torch.Tensor, oracle: torch.Tensor, allowed_rows: int = 0,
                        loose=None, term_scale: float = 0.0) -> str | None:
    """None when ``got`` is within the derived bound (module docstring), else what is wrong, in words.

    ``allowed_rows`` rows may exceed the row bound if every element there is within ``loose`` (atol, rtol) of
    ``want``; they are left out of the whole-tensor bound. ``term_scale`` (the op's ``error_scale``) raises each row's
    magnitude to at least it: a sum of terms of that size may err by roundings of it, however small the sum."""
    g, w, o = _rows(got.cpu()), _rows(want.cpu()), _rows(oracle.cpu())
    if not g.numel():
        return None
    u = unit_roundoff(got.dtype)
    finite = torch.isfinite(o) & torch.isfinite(w)  # where the reference overflows its dtype, so may the kernel
    if not bool(torch.isfinite(g)[finite].all()):
        bad = (~torch.isfinite(g) & finite).nonzero()[0].tolist()
        return (f"non-finite value {g[bad[0], bad[1]].item()} at row {bad[0]}, column {bad[1]} where the fp64 result "
                f"is {o[bad[0], bad[1]].item():.6g}")
    g, w, o = (torch.where(finite, t, 0.0) for t in (g, w, o))
    err = (g - o).abs()
    ref_err = (w - o).abs()
    row_mag = o.abs().amax(-1).clamp(min=term_scale)
    row_bound = ENVELOPE * (ref_err.amax(-1) + u * row_mag)
    row_err = err.amax(-1)
    over = row_err > row_bound
    excused = torch.zeros_like(over)
    if allowed_rows and bool(over.any()):
        cand = over.nonzero().flatten()
        if len(cand) <= allowed_rows and loose is not None:
            within = ((g[cand] - w[cand]).abs() <= loose.atol + loose.rtol * w[cand].abs()).all(-1)
            if bool(within.all()):
                excused[cand] = True
    over = over & ~excused
    if bool(over.any()):
        rows = over.nonzero().flatten()
        r = int((row_err - row_bound).masked_fill(~over, -1).argmax())
        c = int(err[r].argmax())
        return (f"{len(rows)} of {g.shape[0]} rows exceed the bound derived from the reference's own error "
                f"(first bad rows {rows[:8].tolist()}); worst: row {r}, column {c}: got {g[r, c].item():.8g}, fp64 "
                f"result {o[r, c].item():.8g}, error {row_err[r].item():.3g} > bound {row_bound[r].item():.3g} = "
                f"{ENVELOPE:g} x (reference's error {ref_err[r].amax().item():.3g} + {u:.3g} x row max "
                f"{row_mag[r].item():.3g})")
    keep = ~excused
    if bool(keep.any()):
        ge = err[keep].norm().item()
        mag = torch.maximum(o[keep].abs(), torch.full_like(o[keep], term_scale))
        bound = ENVELOPE * (ref_err[keep].norm().item() + u * mag.norm().item())
        if ge > bound:
            return (f"the output as a whole errs by {ge / max(o[keep].norm().item(), 1e-300):.3g} (relative 2-norm "
                    f"against the fp64 result), more than {ENVELOPE:g} x the reference's "
                    f"{ref_err[keep].norm().item() / max(o[keep].norm().item(), 1e-300):.3g} plus one rounding "
                    f"({u:.3g}): a systematic error (a scale, an epsilon, a dropped term)?")
    return None


def allowed_tipped_rows(op, output: torch.Tensor) -> int:
    """Rows of ``output`` that may step outside the row bound for an op that quantizes an intermediate."""
    if not getattr(op, "quantizes_intermediates", False):
        return 0
    rows = 1 if output.dim() == 0 else output.numel() // max(output.shape[-1], 1)
    return max(1, rows // 64)
