// AVX-512 silu_and_mul: 16 lanes, masked tails, so any d stays in the vector loop.
#include "activation.h"
#include "activation_exp_x86.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX512 void run(const SiluMulArgs& a, int64_t r0, int64_t r1) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t i = 0; i < a.d; i += 16) {
      const __mmask16 m = tail_mask(a.d - i);
      __m512 g, u;
      if (kBf16) {
        const uint16_t* x = static_cast<const uint16_t*>(a.x) + r * a.x_stride;
        g = bf16x16_load(x + i, m);
        u = bf16x16_load(x + a.d + i, m);
      } else {
        const float* x = static_cast<const float*>(a.x) + r * a.x_stride;
        g = _mm512_maskz_loadu_ps(m, x + i);
        u = _mm512_maskz_loadu_ps(m, x + a.d + i);
      }
      const __m512 neg_g = _mm512_sub_ps(_mm512_setzero_ps(), g);
      const __m512 v = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, exp512(neg_g))), u);
      if (kBf16) bf16x16_store(static_cast<uint16_t*>(a.out) + r * a.out_stride + i, v, m);
      else _mm512_mask_storeu_ps(static_cast<float*>(a.out) + r * a.out_stride + i, m, v);
    }
  }
}

}  // namespace

void silu_and_mul_avx512(const SiluMulArgs& a, int64_t r0, int64_t r1) {
  if (a.dtype == DType::BF16) run<true>(a, r0, r1);
  else run<false>(a, r0, r1);
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
