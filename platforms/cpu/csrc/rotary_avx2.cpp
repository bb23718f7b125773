// AVX2 rotary: 8 pairs (neox) or 4 pairs (GPT-J) per step, as in rotary_avx512.cpp; the pairs that
// do not fill a vector go through the scalar variant.
#include "rotary.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX2 inline __m256 ld(const void* p, int64_t i) {
  if (kBf16) return bf16x8_load(static_cast<const uint16_t*>(p) + i);
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

template <bool kBf16>
ENGINE_AVX2 inline void st(void* p, int64_t i, __m256 v) {
  if (kBf16) bf16x8_store(static_cast<uint16_t*>(p) + i, v);
  else _mm256_storeu_ps(static_cast<float*>(p) + i, v);
}

template <bool kBf16>
ENGINE_AVX2 void run(const RotaryRow& r) {
  const int64_t half = r.rot_dim / 2;
  const int64_t body = r.neox ? half / 8 * 8 : half / 4 * 4;  // pairs done in vectors
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const __m256 even_sign = _mm256_castsi256_ps(_mm256_set1_epi64x(0x80000000LL));
  for (int64_t h = 0; h < r.heads; ++h) {
    const int64_t o = h * r.head_dim;
    if (r.neox) {
      for (int64_t j = 0; j < body; j += 8) {
        const __m256 c = _mm256_loadu_ps(r.cos + j), s = _mm256_loadu_ps(r.sin + j);
        const __m256 a = ld<kBf16>(r.x, o + j), b = ld<kBf16>(r.x, o + half + j);
        st<kBf16>(r.out, o + j, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
        st<kBf16>(r.out, o + half + j, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
      }
    } else {
      for (int64_t j = 0; j < body; j += 4) {  // channels 2j .. 2j+7
        const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(r.cos + j)), dup);
        const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(r.sin + j)), dup);
        const __m256 x = ld<kBf16>(r.x, o + 2 * j);
        const __m256 sw = _mm256_permute_ps(x, 0xB1);
        st<kBf16>(r.out, o + 2 * j, _mm256_add_ps(_mm256_mul_ps(x, c), _mm256_mul_ps(sw, _mm256_xor_ps(s, even_sign))));
      }
    }
  }
  // Leftover pairs of every head, and the pass-through channels.
  rotary_row_scalar(r, body, true);
}

}  // namespace

void rotary_row_avx2(const RotaryRow& r) {
  if (r.dtype == DType::BF16) run<true>(r);
  else run<false>(r);
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
