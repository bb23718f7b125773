"""The rocm platform (AMD GPUs): AITER kernels when installed, portable Triton otherwise.

Only the cheap probe lives here; the Platform subclass is in ``platform.py``.
"""

from __future__ import annotations

# gfx archs whose FP8 is the e4m3fnuz flavour (MI300 series); later ones use OCP e4m3fn.
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")
# README.md's install command for this platform's extra (the probe's hint names it verbatim).
INSTALL_EXTRA = 'pip install -e ".[rocm]"'


def probe_reason(hip_version: str | None, torch_version: str, device_count: int) -> tuple[bool, str]:
    if not hip_version:
        return False, (f"torch {torch_version} is not a ROCm (HIP) build; for an AMD GPU, install a ROCm build "
                       f"of torch (https://pytorch.org/get-started) and {INSTALL_EXTRA}")
    if device_count == 0:
        return False, f"torch is a ROCm build (HIP {hip_version}) but no AMD GPU is visible (check HIP_VISIBLE_DEVICES)"
    return True, f"{device_count} AMD GPU(s) visible (HIP {hip_version})"


def fp8_is_fnuz(gcn_arch_name: str) -> bool:
    return gcn_arch_name.split(":")[0] in FNUZ_ARCHS


def probe() -> tuple[bool, str]:
    import torch

    hip = torch.version.hip
    return probe_reason(hip, torch.__version__, torch.cuda.device_count() if hip else 0)
