"""PpcPlatform: the cpu platform on POWER9 or newer (ppc64le, VSX)."""

from __future__ import annotations

from engine.platforms.cpu.platform import CpuPlatform

from . import probe

# What the native module brings on POWER (the `vsx` ISA variant, platforms/cpu/csrc/*_vsx.cpp) and what still
# runs the portable C++ paths there. Keep in step with the csrc files. The C++ kernels take fp16 storage
# (POWER9 xvcvhpsp / xvcvsphp), but fp16 is not a supported dtype of this platform yet: the Python op wrappers
# pass only fp32 / bf16 to the native kernels and no op dispatches fp16 to the fp16 linear, so an fp16 model
# would run the plain-torch references.
VSX_KERNELS = ("paged attention (C++: fp32/bf16/fp16 storage)", "RMSNorm, rotary, SiLU-and-mul (C++: fp32/bf16/fp16)",
               "GGUF linear with fp32 activations (Q4_0/Q4_1/Q8_0)", "MoE (fp32/bf16)",
               "fp16 linear (native kernel, not yet an op)")
PORTABLE_KERNELS = ("GGUF Q8-activation linear",)


class PpcPlatform(CpuPlatform):
    name = "ppc"
    priority = 20  # above cpu: where POWER9 VSX is present, its kernels are preferred
    description = ("POWER9+ (ppc64le): the cpu kernels, with VSX paged attention, RMSNorm, rotary, SiLU-and-mul, "
                   "MoE and fp32-activation GGUF linear; the Q8-activation GGUF linear runs the portable C++ path "
                   "(fp16 is not a supported dtype yet: its VSX kernels are built, no op routes fp16 to them)")

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
