"""PpcPlatform: the cpu platform plus POWER9 VSX fp16 kernels."""

from __future__ import annotations

import torch

from engine.platforms.cpu.platform import CpuPlatform

from . import probe


class PpcPlatform(CpuPlatform):
    name = "ppc"
    priority = 20  # above cpu: where VSX fp16 is present, its kernels are preferred
    description = "POWER9+ (ppc64le): cpu kernels plus VSX fp16 GEMM"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.bfloat16, torch.float16)
