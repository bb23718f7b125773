"""The kit's error bound, derived from the reference's own error against an fp64 computation.

For an op whose declared tolerance is not exact, every check computes three results from the same inputs:

* ``oracle``: the reference run on the inputs widened to float64 (and asked for a float64 output), so it
  accumulates in fp64 and rounds nothing to the check's dtype: the best answer the specification gives;
* ``want``: the reference run as the kernel is, in the check's dtype (fp32 accumulation, outputs rounded);
* ``got``: the kernel's result.

A kernel may err from the oracle by at most ``ENVELOPE`` times what the reference errs, measured per output row
(the last dimension) and over the whole output:

    per row r:   max_j |got - oracle|  <=  ENVELOPE * (rho + u) * max_j |oracle|
                 rho = max over rows of  max_j |want - oracle| / max_j |oracle|   (the reference's relative error)
    whole:       ||got - oracle||_2    <=  ENVELOPE * (||want - oracle||_2 + u * ||oracle||_2)

where ``ENVELOPE * u`` is ``ROUNDINGS[dtype]`` units of rounding of the output's dtype. The row
bound scales with each row's own magnitude (a row of huge values does not hide an error in a row of small ones);
the whole-tensor bound catches systematic errors (a scale off by a few per cent) that stay under the per-element
bound of a low-precision dtype. An op that quantizes an intermediate (``OpDef.quantizes_intermediates``) may have rows
outside the row bound, each within the op's declared tolerance, while the whole-tensor bound holds over all rows: a
kernel that sums in another order may round an activation to the neighbouring FP8 or int8 step, which moves that
row, but not the output as a whole. An op whose hardware arithmetic is coarser than fp32
(``OpDef.accumulation_roundoff``: FP8 tensor cores) has that relative error added to the roundings allowed.
"""

from __future__ import annotations

import torch

# How many times the reference's own error a kernel may make, plus how many roundings of the row's largest value.
# A bf16/fp16 output is dominated by its own final rounding (one, and one more for slack). An fp32 output carries the
# summation order of long reductions: the CPU's GGUF prefill GEMM (oneDNN on dequantized weights) measured 14
# roundings of the output's largest value where the reference (torch's fp32 matmul) made 5 (K = 576 and 4096).
ENVELOPE = 4.0
ROUNDINGS = {torch.float32: 64.0, torch.bfloat16: 2.0, torch.float16: 2.0}
WIDE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0, times the roundings a kernel may add (ROUNDINGS) over ENVELOPE."""
    return torch.finfo(dtype).eps / 2 * ROUNDINGS.get(dtype, 2.0) / ENVELOPE


def widen(args, dtype):
    """The oracle's arguments: float tensors of fp32/bf16/fp16 as float64 (same values), and a dtype argument equal to
    the check's dtype (an ``out_dtype``) as float64. Quantized tensors (fp8, packed integers) stay as they are."""
    def one(a):
        if isinstance(a, torch.Tensor) and a.dtype in WIDE_DTYPES:
            return a.detach().contiguous().double()  # on its device: an accelerator computes the oracle too
        if isinstance(a, torch.Tensor):
            return a.detach().contiguous()
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


def envelope_violations(got: torch.Tensor, want: torch.Tensor, oracle: torch.Tensor, tipping: bool = False,
                        loose=None, term_scale: float = 0.0, extra_roundoff: float = 0.0) -> str | None:
    """None when ``got`` is within the derived bound (module docstring), else what is wrong, in words.

    With ``tipping`` (an op that quantizes an intermediate), rows may exceed the row bound where every element is
    within ``loose`` (atol, rtol) of ``want``; the whole-tensor bound still holds over every row, so a systematic
    error is caught while an activation rounded to the neighbouring step is not. ``term_scale`` (the op's
    ``error_scale``) raises each row's magnitude to at least it: a sum of terms of that size may err by roundings of
    it, however small the sum. ``extra_roundoff`` (the op's ``accumulation_roundoff``) raises the roundings allowed
    to that relative size."""
    g, w, o = _rows(got.cpu()), _rows(want.cpu()), _rows(oracle.cpu())
    if not g.numel():
        return None
    u = max(unit_roundoff(got.dtype), extra_roundoff)
    finite = torch.isfinite(o) & torch.isfinite(w)  # where the reference overflows its dtype, so may the kernel
    if not bool(torch.isfinite(g)[finite].all()):
        bad = (~torch.isfinite(g) & finite).nonzero()[0].tolist()
        return (f"non-finite value {g[bad[0], bad[1]].item()} at row {bad[0]}, column {bad[1]} where the fp64 result "
                f"is {o[bad[0], bad[1]].item():.6g}")
    g, w, o = (torch.where(finite, t, 0.0) for t in (g, w, o))
    err, ref_err, row_mag, rho, row_bound = _row_bounds(g, w, o, u, term_scale)
    row_err = err.amax(-1)
    over = row_err > row_bound
    if tipping and loose is not None and bool(over.any()):
        over = over & ~((g - w).abs() <= loose.atol + loose.rtol * w.abs()).all(-1)
    if bool(over.any()):
        rows = over.nonzero().flatten()
        r = int((row_err - row_bound).masked_fill(~over, -1).argmax())
        c = int(err[r].argmax())
        return (f"{len(rows)} of {g.shape[0]} rows exceed the bound derived from the reference's own error "
                f"(first bad rows {rows[:8].tolist()}); worst: row {r}, column {c}: got {g[r, c].item():.8g}, fp64 "
                f"result {o[r, c].item():.8g}, error {row_err[r].item():.3g} > bound {row_bound[r].item():.3g} = "
                f"{ENVELOPE:g} x (the reference's relative error {rho:.3g} + {u:.3g}) x "
                f"row magnitude {row_mag[r].item():.3g}")
    ge, norm = err.norm().item(), max(o.norm().item(), 1e-300)
    mag = torch.maximum(o.abs(), torch.full_like(o, term_scale))
    bound = ENVELOPE * (ref_err.norm().item() + u * mag.norm().item())
    if ge > bound:
        return (f"the output as a whole errs by {ge / norm:.3g} (relative 2-norm against the fp64 result), more "
                f"than {ENVELOPE:g} x (the reference's {ref_err.norm().item() / norm:.3g} + {u:.3g} of rounding): "
                "a systematic error (a scale, an epsilon, a dropped term)?")
    return None


def _row_bounds(g, w, o, u: float, term_scale: float):
    """(|g - o|, |w - o|, each row's magnitude, the reference's relative error rho, each row's bound) of rows of
    finite values."""
    err, ref_err = (g - o).abs(), (w - o).abs()
    row_mag = o.abs().amax(-1).clamp(min=term_scale)
    rho = _relative_ref_error(ref_err, row_mag)
    return err, ref_err, row_mag, rho, ENVELOPE * (rho + u) * row_mag


def _relative_ref_error(ref_err: torch.Tensor, row_mag: torch.Tensor) -> float:
    """The reference's worst error relative to its row's magnitude, over all rows (the max over many rows is a
    steadier measure of the arithmetic's error than one row's own, which may be zero by luck)."""
    nonzero = row_mag > 0
    if not bool(nonzero.any()):
        return 0.0
    return float((ref_err.amax(-1)[nonzero] / row_mag[nonzero]).max())


def bound_used(got: torch.Tensor, want: torch.Tensor, oracle: torch.Tensor, term_scale: float = 0.0,
               extra_roundoff: float = 0.0) -> float:
    """The largest fraction of its row bound any row of ``got`` uses (1.0: at the bound): how much margin a kernel
    leaves (benchmarks/kit_margins.py reports it per op)."""
    g, w, o = _rows(got.cpu()), _rows(want.cpu()), _rows(oracle.cpu())
    finite = torch.isfinite(o) & torch.isfinite(w) & torch.isfinite(g)
    g, w, o = (torch.where(finite, t, 0.0) for t in (g, w, o))
    if not g.numel():
        return 0.0
    err, _, _, _, row_bound = _row_bounds(g, w, o, max(unit_roundoff(got.dtype), extra_roundoff), term_scale)
    return float((err.amax(-1) / row_bound.clamp(min=1e-300)).max())
