"""Native RMSNorm and fused residual-add RMSNorm (fp32 / bf16 / fp16 storage, fp32 math)."""

from __future__ import annotations

import torch

from engine.core.ops.norm import fused_add_rms_norm, rms_norm
from engine.platforms.cpu import _native

from ._common import PRIORITY, STORAGE_CODE, STORAGE_NAMES, empty_rows, isa_note, row_layout_ok, rows_of


def _supports_rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 0.0):
    if x.device.type != "cpu" or weight.device.type != "cpu":
        return "tensors must be on the cpu device"
    if x.dtype not in STORAGE_CODE:
        return f"dtype {x.dtype} not supported ({STORAGE_NAMES})"
    if weight.dtype != x.dtype:
        return f"weight dtype {weight.dtype} differs from x dtype {x.dtype}"
    if x.dim() < 1 or x.shape[-1] == 0:
        return "x must be [..., hidden] with hidden > 0"
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1] or not weight.is_contiguous():
        return "weight must be a contiguous [hidden] vector"
    if not row_layout_ok(x):
        return "x is not contiguous (nor a 2-D tensor with unit last stride)"
    return True


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if weight.shape != x.shape[-1:]:  # not in the dispatch cache key: guard the raw pointers
        return rms_norm.reference(x, weight, eps)
    x2, rows, stride = rows_of(x)
    out = empty_rows(x)
    hidden = x.shape[-1]
    _native.rms_norm(x2.data_ptr(), stride, weight.contiguous().data_ptr(), out.data_ptr(), hidden,
                     rows, hidden, eps, STORAGE_CODE[x.dtype])
    return out


def _supports_fused(x, residual, weight, eps=0.0):
    ok = _supports_rms(x, weight)
    if ok is not True:
        return ok
    if residual.device.type != "cpu" or residual.dtype != x.dtype or residual.shape != x.shape:
        return "residual must be a cpu tensor of x's dtype and shape"
    if not row_layout_ok(residual):
        return "residual is not contiguous (nor a 2-D tensor with unit last stride)"
    return True


def _fused_add_rms_norm(x, residual, weight, eps):
    if weight.shape != x.shape[-1:] or residual.shape != x.shape:  # see _rms_norm
        return fused_add_rms_norm.reference(x, residual, weight, eps)
    x2, rows, xs = rows_of(x)
    r2, _, rs = rows_of(residual)
    out = empty_rows(x)
    s = empty_rows(x)
    hidden = x.shape[-1]
    _native.fused_add_rms_norm(x2.data_ptr(), xs, r2.data_ptr(), rs, weight.contiguous().data_ptr(),
                               out.data_ptr(), hidden, s.data_ptr(), hidden, rows, hidden, eps,
                               STORAGE_CODE[x.dtype])
    return out, s


def register(registry) -> None:
    registry.register(rms_norm, _rms_norm, name="native", supports=_supports_rms, priority=PRIORITY,
                      note=isa_note())
    registry.register(fused_add_rms_norm, _fused_add_rms_norm, name="native", supports=_supports_fused,
                      priority=PRIORITY, note=isa_note())
