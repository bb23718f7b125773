"""PpcPlatform: the cpu platform on POWER9 or newer (ppc64le, VSX)."""

from __future__ import annotations

import torch

from engine.platforms.cpu.platform import CpuPlatform

from . import probe

# What the native module brings on POWER (the `vsx` ISA variant, platforms/cpu/csrc/*_vsx.cpp) and what still
# runs the portable C++ paths there. Keep in step with the csrc files and the cpu kernel wrappers. fp16 models run
# the native kernels with fp16 storage (POWER9 xvcvhpsp / xvcvsphp conversions, fp32 FMA): dense linears of every M
# (kernels/linear.py says why every M), RMSNorm, rotary, SiLU-and-mul and paged attention; GGUF linears take fp16
# activations through their fp32 kernels (x widened, y rounded once); MoE in fp16 and the ops the cpu platform has
# no kernel for run their plain-torch references (the registry says so once).
VSX_KERNELS = ("paged attention (C++: fp32/bf16/fp16 storage)", "RMSNorm, rotary, SiLU-and-mul (C++: fp32/bf16/fp16)",
               "fp16 dense linear (C++, every M; fp32/bf16 dense linears run torch's BLAS)",
               "GGUF linear with fp32 activations (Q4_0/Q4_1/Q8_0; fp16 x widened to fp32)",
               "GGUF linear with Q8 activations (vmsummbm block dots)", "GGUF dequantize", "MoE (fp32/bf16)")
PORTABLE_KERNELS: tuple[str, ...] = ()


class PpcPlatform(CpuPlatform):
    name = "ppc"
    priority = 20  # above cpu: where POWER9 VSX is present, its kernels are preferred
    description = ("POWER9+ (ppc64le): the cpu kernels, with VSX paged attention, RMSNorm, rotary, SiLU-and-mul, "
                   "MoE, GGUF dequantize and GGUF linears (fp32 and Q8 activations), and fp16 as a supported dtype "
                   "(VSX fp16 dense linear; attention and the small ops on fp16 storage; GGUF linears through fp32); "
                   "MoE in fp16 runs the plain-torch reference")

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

    def fp16_linear_max_m(self, isa: str, cpuinfo: str) -> int | None:
        from engine.platforms.cpu.kernels.linear import ppc_fp16_max_m

        return ppc_fp16_max_m(isa, cpuinfo)  # every M on VSX (kernels/linear.py)

    def supported_dtypes(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.bfloat16, torch.float16)

    def facts(self) -> dict[str, object]:
        out = super().facts()
        try:
            from engine.platforms.cpu import _native
            built = "vsx" in _native.supported_isas()
        except Exception as exc:  # reported by the cpu facts too; not fatal
            out["vsx_kernels"] = f"native module unavailable: {type(exc).__name__}: {exc}"
            return out
        out["vsx_kernels"] = (f"in use: {', '.join(VSX_KERNELS)}" if built else
                              f"not in use (this build has no VSX kernels): would use {', '.join(VSX_KERNELS)}")
        out["portable_kernels"] = ", ".join(PORTABLE_KERNELS) or "none"
        return out
