"""RiscvPlatform: the cpu platform on RISC-V 64 with the V extension (RVV 1.0)."""

from __future__ import annotations

from engine.platforms.cpu.platform import CpuPlatform

from . import probe

# What the native module brings on RVV hardware (platforms/cpu/csrc/*_rvv.cpp, picked at run time from AT_HWCAP),
# and what still runs the portable C++ paths there. Keep in step with the csrc files.
RVV_KERNELS = ("gguf_linear (Q4_0/Q4_1/Q8_0, GEMV and GEMM)", "gguf_linear_q8act (Q4_0/Q4_1/Q8_0)",
               "RMSNorm, rotary, SiLU-and-mul (vector-length agnostic)",
               "paged attention and MoE (128-bit vectors: correct at any VLEN, not widened past 128)")
PORTABLE_KERNELS = ("GGUF dequantize (the prefill-sized GGUF matmuls: dequantize, then torch's GEMM)",)


class RiscvPlatform(CpuPlatform):
    name = "riscv"
    priority = 20  # above cpu: where RVV is present, its kernels are preferred
    description = ("RISC-V 64 with RVV 1.0: the cpu kernels, with vector-length-agnostic RVV GGUF linears "
                   "(fp32 and Q8 activations) and small ops, and RVV paged attention and MoE at 128-bit vectors")

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def facts(self) -> dict[str, object]:
        out = super().facts()
        try:
            from engine.platforms.cpu import _native
            built = "rvv" in _native.supported_isas()
        except Exception as exc:  # reported by the cpu facts too; not fatal
            built = False
            out["rvv_kernels"] = f"native module unavailable: {type(exc).__name__}: {exc}"
            return out
        out["rvv_kernels"] = (f"in use: {', '.join(RVV_KERNELS)}" if built else
                              "not in use (this build has no RVV kernels or this CPU lacks V): "
                              f"would use {', '.join(RVV_KERNELS)}")
        out["portable_kernels"] = ", ".join(PORTABLE_KERNELS) or "none"
        return out
