"""RocmPlatform: AMD GPUs (torch exposes them through its "cuda" device type)."""

from __future__ import annotations

import torch

from engine.core.platform import TorchAcceleratorPlatform

from . import fp8_is_fnuz, probe


class RocmPlatform(TorchAcceleratorPlatform):
    name = "rocm"
    device_type = "cuda"  # HIP builds of torch reuse the cuda device type
    priority = 100
    description = ("AMD GPUs: AITER's MLA decode and FP8 GEMMs on gfx942/gfx950 where aiter imports, the portable "
                   "Triton kernels for the rest; RCCL. Not run on AMD hardware here")
    dist_backend = "nccl"
    device_control_env_var = "HIP_VISIBLE_DEVICES"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def gcn_arch(self, index: int = 0) -> str:
        return torch.cuda.get_device_properties(index).gcnArchName

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.bfloat16, torch.float16, torch.float32)

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fnuz if fp8_is_fnuz(self.gcn_arch()) else torch.float8_e4m3fn

    def register_kernels(self, registry) -> None:
        """The portable Triton kernels on ROCm's Triton backend, and AITER's adapters above them where aiter imports
        on an arch it is built for (aiter_kernels.py)."""
        from engine.platforms import triton_kernels

        from . import aiter_kernels

        triton_kernels.register(registry, self.device_type, None)
        aiter_kernels.register(registry, self.gcn_arch(), self.fp8_dtype())
