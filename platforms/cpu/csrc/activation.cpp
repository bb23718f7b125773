// silu_and_mul: dispatcher and the portable scalar path.
#include "activation.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "thread_pool.h"

namespace engine_cpu {
namespace {

template <bool kBf16>
void run(const SiluMulArgs& a, int64_t r0, int64_t r1, int64_t col0) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = col0; i < a.d; ++i) {
      float g, u;
      if constexpr (kBf16) {
        const uint16_t* x = static_cast<const uint16_t*>(a.x) + r * a.x_stride;
        g = bf16_to_f32(x[i]);
        u = bf16_to_f32(x[a.d + i]);
      } else {
        const float* x = static_cast<const float*>(a.x) + r * a.x_stride;
        g = x[i];
        u = x[a.d + i];
      }
      const float v = g / (1.0f + std::exp(-g)) * u;
      if constexpr (kBf16) static_cast<uint16_t*>(a.out)[r * a.out_stride + i] = f32_to_bf16(v);
      else static_cast<float*>(a.out)[r * a.out_stride + i] = v;
    }
  }
}

}  // namespace

void silu_and_mul_scalar(const SiluMulArgs& a, int64_t r0, int64_t r1, int64_t col0) {
  if (a.dtype == DType::BF16) run<true>(a, r0, r1, col0);
  else run<false>(a, r0, r1, col0);
}

void silu_and_mul(const SiluMulArgs& a) {
  if (a.d <= 0 || a.rows < 0) throw std::invalid_argument("silu_and_mul: d must be > 0 and rows >= 0");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16)
    throw std::invalid_argument("silu_and_mul: dtype must be fp32 or bf16");
  void (*fn)(const SiluMulArgs&, int64_t, int64_t) = [](const SiluMulArgs& x, int64_t r0, int64_t r1) {
    silu_and_mul_scalar(x, r0, r1);
  };
#ifdef ENGINE_X86
  if (current_isa() == Isa::Avx512) fn = silu_and_mul_avx512;
  else if (current_isa() == Isa::Avx2) fn = silu_and_mul_avx2;
#endif
  // ~16k outputs per thread at least: waking the pool costs a few microseconds.
  const int64_t grain = std::max<int64_t>(1, 16384 / a.d);
  parallel_for(a.rows, grain, [&](int64_t r0, int64_t r1) { fn(a, r0, r1); });
}

}  // namespace engine_cpu
