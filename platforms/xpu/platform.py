"""XpuPlatform: Intel GPUs through torch.xpu."""

from __future__ import annotations

import torch

from engine.core.platform import TorchAcceleratorPlatform

from . import probe


class XpuPlatform(TorchAcceleratorPlatform):
    name = "xpu"
    device_type = "xpu"
    priority = 90
    description = "Intel GPUs: Triton kernels, oneDNN FP8 GEMM when installed; XCCL"
    dist_backend = "xccl"
    device_control_env_var = "ZE_AFFINITY_MASK"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.bfloat16, torch.float16, torch.float32)

    def register_kernels(self, registry) -> None:
        """The portable Triton kernels on Intel's Triton backend (oneDNN adapters come next to them)."""
        from engine.platforms import triton_kernels

        triton_kernels.register(registry, self.device_type, None)
