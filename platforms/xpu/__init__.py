"""The xpu platform (Intel GPUs): Triton kernels; W8A8 FP8 through torch's oneDNN _scaled_mm (torch >= 2.10).

Only the cheap probe lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

# README.md's install commands for this platform (the probe's hint names them verbatim).
INSTALL_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/xpu"
INSTALL_EXTRA = 'pip install -e ".[xpu]"'


def probe_reason(has_xpu_module: bool, torch_version: str, device_count: int) -> tuple[bool, str]:
    if not has_xpu_module:
        return False, (f"torch {torch_version} has no torch.xpu module; for an Intel GPU, install an XPU build "
                       f"of torch in its place and the xpu extra: pip uninstall -y torch && {INSTALL_TORCH} && "
                       f"{INSTALL_EXTRA}")
    if device_count == 0:
        return False, ("no Intel GPU is visible to torch.xpu (for an Intel GPU: its driver, an XPU build of torch and "
                       "the xpu extra; README.md, 'On a GPU')")
    return True, f"{device_count} Intel GPU(s) visible"


def probe() -> tuple[bool, str]:
    import torch

    has = hasattr(torch, "xpu")
    count = torch.xpu.device_count() if has and torch.xpu.is_available() else 0
    return probe_reason(has, torch.__version__, count)
