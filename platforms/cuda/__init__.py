"""The cuda platform (NVIDIA GPUs): Triton kernels, torch._scaled_mm for FP8, NCCL collectives.

Only the cheap probe lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

# README.md's install commands for this platform ("On a GPU"); the probe's hint names them verbatim.
INSTALL_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130"
INSTALL_EXTRA = 'pip install -e ".[cuda]"'


def probe_reason(cuda_built: bool, hip_version: str | None, torch_version: str, device_count: int) -> tuple[bool, str]:
    """The verdict from the facts (kept pure so the gate is testable on any machine)."""
    if hip_version:
        return False, f"torch {torch_version} is a ROCm (HIP {hip_version}) build; the rocm platform serves it"
    if not cuda_built:
        return False, (f"torch {torch_version} was built without CUDA; for an NVIDIA GPU, install a CUDA build "
                       f"of torch in its place and the cuda extra: pip uninstall -y torch && {INSTALL_TORCH} && "
                       f"{INSTALL_EXTRA} (CUDA 13.0 wheels need NVIDIA driver 580 or newer; README.md, 'On a GPU')")
    if device_count == 0:
        return False, ("torch has CUDA, but no CUDA device is visible (check the driver with nvidia-smi, and "
                       "CUDA_VISIBLE_DEVICES)")
    return True, f"{device_count} CUDA device(s) visible"


def probe() -> tuple[bool, str]:
    import torch

    built = torch.backends.cuda.is_built()
    count = torch.cuda.device_count() if built and not torch.version.hip else 0
    return probe_reason(built, torch.version.hip, torch.__version__, count)
