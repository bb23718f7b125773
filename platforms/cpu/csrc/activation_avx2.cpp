// AVX2 silu_and_mul: 8 lanes, the last d % 8 columns in scalar code.
#include "activation.h"
#include "activation_exp_x86.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX2 void run(const SiluMulArgs& a, int64_t r0, int64_t r1) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const int64_t body = a.d / 8 * 8;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < body; i += 8) {
      __m256 g, u;
      if (kBf16) {
        const uint16_t* x = static_cast<const uint16_t*>(a.x) + r * a.x_stride;
        g = bf16x8_load(x + i);
        u = bf16x8_load(x + a.d + i);
      } else {
        const float* x = static_cast<const float*>(a.x) + r * a.x_stride;
        g = _mm256_loadu_ps(x + i);
        u = _mm256_loadu_ps(x + a.d + i);
      }
      const __m256 neg_g = _mm256_sub_ps(_mm256_setzero_ps(), g);
      const __m256 v = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp256(neg_g))), u);
      if (kBf16) bf16x8_store(static_cast<uint16_t*>(a.out) + r * a.out_stride + i, v);
      else _mm256_storeu_ps(static_cast<float*>(a.out) + r * a.out_stride + i, v);
    }
  }
  if (body < a.d) silu_and_mul_scalar(a, r0, r1, body);  // the last d % 8 columns
}

}  // namespace

void silu_and_mul_avx2(const SiluMulArgs& a, int64_t r0, int64_t r1) {
  if (a.dtype == DType::BF16) run<true>(a, r0, r1);
  else run<false>(a, r0, r1);
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
