"""RiscvPlatform: the cpu platform plus RVV 1.0 kernels (vector-length agnostic)."""

from __future__ import annotations

from engine.platforms.cpu.platform import CpuPlatform

from . import probe


class RiscvPlatform(CpuPlatform):
    name = "riscv"
    priority = 20  # above cpu: where RVV is present, its kernels are preferred
    description = "RISC-V 64 with RVV 1.0: cpu kernels plus RVV INT4 GEMM"

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()
