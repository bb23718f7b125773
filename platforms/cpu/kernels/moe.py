"""Native fused_moe (fp32 / bf16 x and weights, fp32 math): routing, grouping by expert and the expert
GEMMs in one C++ call (platforms/cpu/csrc/moe.h).

Strides are passed through wherever the last dimension is dense; any other layout is copied first (the
registry caches its choice on contiguity alone, so a strided call must still be right).
"""

from __future__ import annotations

import torch

from engine.core.ops.moe import fused_moe, kernel_shape_problem
from engine.platforms.cpu import _native

from ._common import DTYPE_CODE, PRIORITY, isa_note


def _dense_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension has unit stride and its rows do not overlap, else a copy."""
    if t.stride(-1) == 1 and all(t.stride(d) >= t.shape[-1] for d in range(t.dim() - 1)):
        return t
    return t.contiguous()


def _supports(x, w13, w2, router_logits, top_k, renormalize):
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in (x, w13, w2, router_logits)):
        return "x, w13, w2 and router_logits must be cpu tensors"
    if x.dtype not in DTYPE_CODE or not x.dtype == w13.dtype == w2.dtype:
        return f"x, w13, w2 dtypes {x.dtype}, {w13.dtype}, {w2.dtype}: need one of fp32, bf16 for all three"
    if not router_logits.dtype.is_floating_point:
        return f"router_logits dtype {router_logits.dtype} is not a float type"
    problem = kernel_shape_problem(x, w13, w2, router_logits)
    if problem:
        return problem
    e = w13.shape[0]
    if not isinstance(top_k, int) or not 1 <= top_k <= e:
        return f"top_k must be an int in [1, {e}], got {top_k!r}"
    return True


def _fused_moe(x, w13, w2, router_logits, top_k, renormalize):
    tokens, hidden = x.shape
    experts, two_i, _ = w13.shape
    out = torch.empty((tokens, hidden), dtype=x.dtype)
    if tokens == 0:
        return out
    x, w13, w2 = _dense_last(x), _dense_last(w13), _dense_last(w2)
    logits = router_logits if router_logits.dtype in DTYPE_CODE else router_logits.float()  # fp16/fp64: as route()
    logits = _dense_last(logits)
    _native.fused_moe(x.data_ptr(), x.stride(0), w13.data_ptr(), w13.stride(0), w13.stride(1), w2.data_ptr(),
                      w2.stride(0), w2.stride(1), logits.data_ptr(), logits.stride(0), DTYPE_CODE[logits.dtype],
                      out.data_ptr(), hidden, tokens, hidden, two_i // 2, experts, top_k, bool(renormalize),
                      DTYPE_CODE[x.dtype])
    return out


def register(registry) -> None:
    registry.register(fused_moe, _fused_moe, name="native", supports=_supports, priority=PRIORITY, note=isa_note())
