"""The xpu platform (Intel GPUs): Triton kernels; oneDNN for W8A8 FP8 when installed.

Only the cheap probe lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations


def probe_reason(has_xpu_module: bool, torch_version: str, device_count: int) -> tuple[bool, str]:
    if not has_xpu_module:
        return False, f"torch {torch_version} has no torch.xpu module; install torch 2.5 or newer with XPU support"
    if device_count == 0:
        return False, "no Intel GPU is visible to torch.xpu (install the Intel GPU driver and an XPU build of torch)"
    return True, f"{device_count} Intel GPU(s) visible"


def probe() -> tuple[bool, str]:
    import torch

    has = hasattr(torch, "xpu")
    count = torch.xpu.device_count() if has and torch.xpu.is_available() else 0
    return probe_reason(has, torch.__version__, count)
