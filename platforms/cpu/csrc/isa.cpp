#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#if defined(ENGINE_ARM64) || defined(ENGINE_RVV) || defined(ENGINE_VSX_POWER9)
#include <sys/auxv.h>
#endif

namespace engine_cpu {
namespace {
std::atomic<int> g_isa{static_cast<int>(Isa::Scalar)};
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Neon: return "neon";
    case Isa::Vsx: return "vsx";
    case Isa::Rvv: return "rvv";
    default: return "scalar";
  }
}

bool cpu_supports(Isa isa) {
  if (isa == Isa::Scalar) return true;
#ifdef ENGINE_X86
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the YMM/ZMM state (XGETBV).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (isa == Isa::Avx2) return avx2;
  if (isa == Isa::Avx512)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
#ifdef ENGINE_ARM64
  if (isa == Isa::Neon) return true;  // Advanced SIMD is mandatory on AArch64 Linux
#endif
#if defined(ENGINE_VSX) && defined(ENGINE_VSX_POWER9)
  // The *_vsx.cpp kernels are compiled with -mcpu=power9 (fp16 <-> fp32 conversions, ISA 3.0).
  constexpr unsigned long kFeature2Arch300 = 0x00800000UL;  // PPC_FEATURE2_ARCH_3_00, spelled out for old headers
  if (isa == Isa::Vsx) return (getauxval(AT_HWCAP2) & kFeature2Arch300) != 0;
#elif defined(ENGINE_VSX)
  if (isa == Isa::Vsx) return true;  // the build targets a VSX CPU (every ppc64le ABI baseline has it)
#endif
#ifdef ENGINE_RVV
  // The kernel sets bit (letter - 'A') of AT_HWCAP for each single-letter extension; riscv_hwprobe
  // is missing under QEMU 7.2 and in Debian 12's headers.
  if (isa == Isa::Rvv) return (getauxval(AT_HWCAP) >> ('V' - 'A') & 1) != 0;
#endif
  return false;
}

bool cpu_has_dotprod() {
#ifdef ENGINE_ARM64
  constexpr unsigned long kHwcapAsimddp = 1UL << 20;  // HWCAP_ASIMDDP, spelled out for older headers
  return (getauxval(AT_HWCAP) & kHwcapAsimddp) != 0;
#else
  return false;
#endif
}

bool cpu_has_avx512_vnni() {
#ifdef ENGINE_X86
  __builtin_cpu_init();
  return cpu_supports(Isa::Avx512) && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Vsx, Isa::Rvv, Isa::Scalar})
    if (cpu_supports(isa)) out.push_back(isa);
  return out;
}

std::string isa_missing_reason(Isa isa) {
#if defined(ENGINE_VSX) && defined(ENGINE_VSX_POWER9)
  if (isa == Isa::Vsx && !cpu_supports(isa))
    return " (its kernels are built for POWER9, ISA 3.0, and AT_HWCAP2 lacks PPC_FEATURE2_ARCH_3_00: "
           "an older POWER CPU runs the scalar variant)";
#endif
#ifdef ENGINE_RVV
  if (isa == Isa::Rvv && !cpu_supports(isa)) return " (AT_HWCAP has no 'V' bit: the CPU lacks RVV 1.0)";
#endif
  (void)isa;
  return "";
}

Isa current_isa() { return static_cast<Isa>(g_isa.load(std::memory_order_relaxed)); }

void set_isa(const std::string& name) {
  Isa isa;
  if (name == "avx512") isa = Isa::Avx512;
  else if (name == "avx2") isa = Isa::Avx2;
  else if (name == "neon") isa = Isa::Neon;
  else if (name == "vsx") isa = Isa::Vsx;
  else if (name == "rvv") isa = Isa::Rvv;
  else if (name == "scalar") isa = Isa::Scalar;
  else
    throw std::invalid_argument("unknown CPU ISA '" + name +
                                "'; expected one of: avx512, avx2, neon, vsx, rvv, scalar");
  if (!cpu_supports(isa)) {
    std::string have;
    for (Isa s : supported_isas()) have += std::string(have.empty() ? "" : ", ") + isa_name(s);
    throw std::runtime_error("CPU ISA '" + name + "' was requested but this CPU (or this build) cannot run it" +
                             isa_missing_reason(isa) + "; supported here: " + have);
  }
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

void init_isa_from_env() {
  const char* env = std::getenv("ENGINE_CPU_ISA");
  if (env != nullptr && *env != '\0') {
    try {
      set_isa(env);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("ENGINE_CPU_ISA: ") + e.what());
    }
    return;
  }
  g_isa.store(static_cast<int>(supported_isas().front()), std::memory_order_relaxed);
}

}  // namespace engine_cpu
