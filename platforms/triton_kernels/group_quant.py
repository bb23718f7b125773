"""What the Triton kernels of group-quantized weight-only ops (int4_linear, int8_linear) share on the host: the call's
operands made ready for a launch, the choice between their GEMV and tensor-core kernels, and supports()."""

from __future__ import annotations

import torch

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def launch_operands(x, w, w_scale, w_zero, bias):
    """(x with unit stride along K, the empty output [M, N] in x's dtype, the zero-point pointer, the bias, the bias
    pointer): absent zero points and bias are passed as some other tensor the kernels never read."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    if bias is not None and bias.stride(-1) != 1:
        bias = bias.contiguous()  # the kernels read it densely
    return x, out, w_zero if w_zero is not None else w, bias, bias if bias is not None else w_scale


def choose_kernel(kernel: str | None, m: int, default_max_m: int, gemv_max_m: int) -> str:
    """``kernel`` ("gemv" / "dot") or the default for M rows of x: the GEMV up to ``default_max_m``."""
    kernel = kernel or ("gemv" if m <= default_max_m else "dot")
    if kernel == "gemv" and m > gemv_max_m:
        raise ValueError(f"the GEMV kernel takes at most {gemv_max_m} rows of x, got {m}")
    return kernel


def group_supports(device_type: str, check, weight: str):
    """supports() of a group-quantized linear whose weight tensor is named ``weight`` and whose op's ``check(w,
    w_scale, w_zero, group_size, k)`` raises TypeError / ValueError on a malformed weight."""
    def supports(x, w, w_scale, w_zero, group_size, bias):
        tensors = [t for t in (x, w, w_scale, w_zero, bias) if t is not None]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            return f"x, {weight}, w_scale (and w_zero, bias where given) must be tensors"
        if x.device.type != device_type or any(t.device != x.device for t in tensors):
            return f"all tensors must be on one {device_type} device"
        if x.dtype not in X_DTYPES or x.dim() != 2:
            return f"x must be a 2-D fp32, bf16 or fp16 tensor, got {x.dtype} {tuple(x.shape)}"
        try:
            n, _ = check(w, w_scale, w_zero, group_size, x.shape[1])
        except (TypeError, ValueError) as exc:
            return str(exc)
        if not all(t.is_contiguous() for t in (w, w_scale) + ((w_zero,) if w_zero is not None else ())):
            return f"{weight}, w_scale and w_zero must be contiguous"
        if bias is not None and (tuple(bias.shape) != (n,) or not bias.is_floating_point()):
            return f"bias must be None or a floating [N={n}] tensor"
        return True

    return supports
