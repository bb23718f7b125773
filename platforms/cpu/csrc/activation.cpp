// silu_and_mul: validation, the split over rows, and the dispatch to the current ISA's variant
// (activation_impl.h).
#include "activation.h"

#include <algorithm>
#include <stdexcept>

#include "thread_pool.h"

namespace engine_cpu {

void silu_and_mul(const SiluMulArgs& a) {
  if (a.d <= 0 || a.rows < 0) throw std::invalid_argument("silu_and_mul: d must be > 0 and rows >= 0");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16 && a.dtype != DType::F16)
    throw std::invalid_argument("silu_and_mul: dtype must be fp32, bf16 or fp16");
  void (*fn)(const SiluMulArgs&, int64_t, int64_t) = silu_and_mul_scalar;
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: fn = silu_and_mul_avx512; break;
    case Isa::Avx2: fn = silu_and_mul_avx2; break;
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: fn = silu_and_mul_neon; break;
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: fn = silu_and_mul_vsx; break;
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: fn = silu_and_mul_rvv; break;
#endif
    default: break;
  }
  // ~16k outputs per thread at least: waking the pool costs a few microseconds.
  const int64_t grain = std::max<int64_t>(1, 16384 / a.d);
  parallel_for(a.rows, grain, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
}

}  // namespace engine_cpu
