// A minimal harness for the kernel tests: fresh random seed per run (printed on failure; set
// ENGINE_TEST_SEED to replay), failure counting, and a loop over every ISA variant this CPU runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>

#include "isa.h"

namespace check {

inline uint32_t seed() {
  static uint32_t s = [] {
    const char* env = std::getenv("ENGINE_TEST_SEED");
    return env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
  }();
  return s;
}

inline int& failures() {
  static int n = 0;
  return n;
}

inline void fail(const std::string& what) {
  if (++failures() <= 20) std::fprintf(stderr, "FAIL (ENGINE_TEST_SEED=%u): %s\n", seed(), what.c_str());
}

inline bool close(double got, double want, double atol, double rtol) {
  return std::isfinite(got) && std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// Run body(isa_name) once per ISA variant the CPU supports; ends with the process exit status.
// `same_as_scalar`: variants that have no path of their own for the kernels under test (they run the
// portable code the scalar variant already covers), skipped to keep the emulated runs short.
// ENGINE_TEST_ISAS=a,b: only those variants (the extra RVV VLEN runs test only the rvv one).
inline int for_each_isa(const std::function<void(const char*)>& body,
                        std::initializer_list<const char*> same_as_scalar = {}) {
  int ran = 0;
  const char* only = std::getenv("ENGINE_TEST_ISAS");
  for (engine_cpu::Isa isa : engine_cpu::supported_isas()) {
    bool skip = false;
    for (const char* name : same_as_scalar) skip = skip || std::string(name) == engine_cpu::isa_name(isa);
    if (only != nullptr && *only != '\0')
      skip = skip || ("," + std::string(only) + ",").find("," + std::string(engine_cpu::isa_name(isa)) + ",") ==
                         std::string::npos;
    if (skip) continue;
    engine_cpu::set_isa(engine_cpu::isa_name(isa));
    body(engine_cpu::isa_name(isa));
    ++ran;
  }
  if (ran == 0) fail("no ISA variant is supported");
  std::printf("%d ISA variant(s), %d failure(s), seed %u\n", ran, failures(), seed());
  return failures() ? 1 : 0;
}

}  // namespace check
