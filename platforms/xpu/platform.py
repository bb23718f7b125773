"""XpuPlatform: Intel GPUs through torch.xpu."""

from __future__ import annotations

import torch

from engine.core.platform import TorchAcceleratorPlatform

from . import probe


class XpuPlatform(TorchAcceleratorPlatform):
    name = "xpu"
    device_type = "xpu"
    priority = 90
    description = ("Intel GPUs: the portable Triton kernels on XPU torch's own Triton, FP8 GEMM through "
                   "torch._scaled_mm (oneDNN) on torch >= 2.10, else the Triton FP8 GEMM; XCCL. Not run on Intel "
                   "hardware here")
    dist_backend = "xccl"
    device_control_env_var = "ZE_AFFINITY_MASK"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.bfloat16, torch.float16, torch.float32)

    def register_kernels(self, registry) -> None:
        """The portable Triton kernels on Intel's Triton backend; fp8_linear's per-tensor and row-wise cases through
        torch._scaled_mm (oneDNN) where this torch has it (triton_kernels/fp8_linear.py)."""
        from engine.platforms import triton_kernels

        triton_kernels.register(registry, self.device_type, None)
