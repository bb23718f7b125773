// Runtime ISA selection for the CPU kernels: one binary carries every variant it could compile,
// and each kernel entry point switches on current_isa().
#pragma once

#include <string>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define ENGINE_X86 1
#endif
#if defined(__aarch64__) && defined(__GNUC__)
#define ENGINE_ARM64 1
#endif
#if defined(__powerpc64__) && defined(__VSX__) && defined(__GNUC__)
#define ENGINE_VSX 1
#endif
// RVV kernels are compiled with -march=...v for their own files only (the rest stays rv64gc, so a CPU
// without V runs the scalar paths); the build defines ENGINE_BUILD_RVV for every file when it does so.
#if defined(__riscv) && defined(ENGINE_BUILD_RVV) && defined(__GNUC__)
#define ENGINE_RVV 1
#endif

namespace engine_cpu {

// Neon is AArch64's Advanced SIMD (always present there); kernels that also want the int8 dot-product
// instructions (SDOT/UDOT, Armv8.2 dotprod) ask cpu_has_dotprod() and keep a plain-NEON path.
// Vsx: POWER's vector-scalar extension (ppc64le builds have it; where the build compiles the VSX
// kernels for POWER9, ENGINE_VSX_POWER9, the CPU must report ISA 3.0 in AT_HWCAP2); Rvv: RISC-V V 1.0, compiled only
// with -march=...v and used when AT_HWCAP has the 'V' bit.
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3, Vsx = 4, Rvv = 5 };

const char* isa_name(Isa isa);
// ISA variants compiled into this binary that the running CPU (and OS) can execute, best first.
std::vector<Isa> supported_isas();
bool cpu_supports(Isa isa);
// Why a variant compiled into this build cannot run on this CPU (" (...)", empty when it can or when
// there is nothing to add to "cannot run it").
std::string isa_missing_reason(Isa isa);
// AArch64 with the dotprod extension (HWCAP_ASIMDDP); false elsewhere.
bool cpu_has_dotprod();
// x86 with AVX512_VNNI (vpdpbusd on 512-bit vectors); false elsewhere.
bool cpu_has_avx512_vnni();
// The variant the kernels use now. Initially ENGINE_CPU_ISA if set, else the best supported.
Isa current_isa();
// Select a variant by name (avx512, avx2, neon, vsx, rvv, scalar); throws std::invalid_argument for an unknown
// name and std::runtime_error when this CPU or build cannot run it.
void set_isa(const std::string& name);
// Apply ENGINE_CPU_ISA (if set) or pick the best; called once at module import.
void init_isa_from_env();

}  // namespace engine_cpu
