"""CudaPlatform: NVIDIA GPUs through torch's CUDA device module."""

from __future__ import annotations

import torch

from engine.core.platform import TorchAcceleratorPlatform

from . import probe


class CudaPlatform(TorchAcceleratorPlatform):
    name = "cuda"
    device_type = "cuda"
    priority = 100
    description = "NVIDIA GPUs: Triton kernels, FP8 via torch._scaled_mm, NCCL"
    dist_backend = "nccl"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"
    async_scheduling = True  # graph replays and kernels run queued: the next step's host work hides behind them

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def capability(self, index: int = 0) -> tuple[int, int] | None:
        return tuple(torch.cuda.get_device_capability(index))

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.bfloat16, torch.float16, torch.float32)

    def register_kernels(self, registry) -> None:
        """The portable Triton kernels (compute capability gates their FP8 and NVFP4 paths), then this plugin's own:
        FlashInfer where installed, and the Hopper Gluon kernels (each gated on sm_90 and Gluon, else skipped)."""
        from engine.platforms import triton_kernels

        from . import flashinfer_attention, gluon_fp8_block, gluon_nvfp4

        capability = self.capability()
        triton_kernels.register(registry, self.device_type, capability)
        flashinfer_attention.register(registry, self.device_type, capability)  # where installed; else skipped
        gluon_fp8_block.register(registry, self.device_type, capability)
        gluon_nvfp4.register(registry, self.device_type, capability)
        registry.reference_only("all_reduce", "torch.distributed's all_reduce (NCCL) until the custom all-reduce "
                                              "(issue 30)")
        registry.reference_only("gguf_linear_q8act", "int8-activation GGUF matmuls are the CPU's (llama.cpp's) "
                                                     "arithmetic; GPUs serve GGUF through gguf_linear")
