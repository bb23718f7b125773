"""PpcPlatform: the cpu platform on POWER9 or newer (ppc64le, VSX)."""

from __future__ import annotations

from engine.platforms.cpu.platform import CpuPlatform

from . import probe

# What the native module brings on POWER (the `vsx` ISA variant, platforms/cpu/csrc/*_vsx.cpp) and what still
# runs the portable C++ paths there. fp16 is not a supported dtype: the VSX fp16 linear exists as a native
# kernel (_native.fp16_linear) but no op dispatches fp16 to it yet, and attention has no fp16 path.
VSX_KERNELS = ("paged attention (fp32/bf16)", "fp16 linear (native kernel, not yet an op)")
PORTABLE_KERNELS = ("GGUF linears", "MoE", "RMSNorm", "rotary", "SiLU-and-mul")


class PpcPlatform(CpuPlatform):
    name = "ppc"
    priority = 20  # above cpu: where POWER9 VSX is present, its kernels are preferred
    description = ("POWER9+ (ppc64le): the cpu kernels, with VSX paged attention; GGUF linears, MoE and the small "
                   "ops run the portable C++ paths (fp16 is not a supported dtype yet)")

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        return probe()

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
        out["portable_kernels"] = ", ".join(PORTABLE_KERNELS)
        return out
