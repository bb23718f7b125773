// AVX-512 rotary: neox pairs 16 at a time (masked tails); GPT-J loads 16 interleaved channels, swaps
// each pair in-register and applies the duplicated cos and the sign-alternated sin.
#include <cstring>

#include "rotary.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX512 inline __m512 ld(const void* p, int64_t i, __mmask16 m) {
  if (kBf16) return bf16x16_load(static_cast<const uint16_t*>(p) + i, m);
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

template <bool kBf16>
ENGINE_AVX512 inline void st(void* p, int64_t i, __m512 v, __mmask16 m) {
  if (kBf16) bf16x16_store(static_cast<uint16_t*>(p) + i, v, m);
  else _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
}

template <bool kBf16>
ENGINE_AVX512 void run(const RotaryRow& r) {
  const int64_t half = r.rot_dim / 2, es = kBf16 ? 2 : 4;
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i even_sign = _mm512_set1_epi64(0x80000000LL);  // sign bit of every even lane
  for (int64_t h = 0; h < r.heads; ++h) {
    const int64_t o = h * r.head_dim;
    if (r.neox) {
      for (int64_t j = 0; j < half; j += 16) {
        const __mmask16 m = tail_mask(half - j);
        const __m512 c = _mm512_maskz_loadu_ps(m, r.cos + j), s = _mm512_maskz_loadu_ps(m, r.sin + j);
        const __m512 a = ld<kBf16>(r.x, o + j, m), b = ld<kBf16>(r.x, o + half + j, m);
        st<kBf16>(r.out, o + j, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)), m);
        st<kBf16>(r.out, o + half + j, _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)), m);
      }
    } else {
      for (int64_t i = 0; i < r.rot_dim; i += 16) {  // channels i .. i+15 = pairs i/2 .. i/2+7
        const __mmask16 m = tail_mask(r.rot_dim - i);
        const __mmask8 m8 = static_cast<__mmask8>(tail_mask((r.rot_dim - i) / 2));
        const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, r.cos + i / 2)));
        const __m512 s = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, r.sin + i / 2)));
        const __m512 x = ld<kBf16>(r.x, o + i, m);
        const __m512 sw = _mm512_permute_ps(x, 0xB1);  // (b, a) in each pair
        // even lanes: a*c + b*(-s) (== a*c - b*s exactly); odd lanes: b*c + a*s
        const __m512 ns = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(s), even_sign));
        st<kBf16>(r.out, o + i, _mm512_add_ps(_mm512_mul_ps(x, c), _mm512_mul_ps(sw, ns)), m);
      }
    }
    if (r.rot_dim < r.head_dim)
      std::memcpy(static_cast<char*>(r.out) + (o + r.rot_dim) * es,
                  static_cast<const char*>(r.x) + (o + r.rot_dim) * es, (r.head_dim - r.rot_dim) * es);
  }
}

}  // namespace

void rotary_row_avx512(const RotaryRow& r) {
  if (r.dtype == DType::BF16) run<true>(r);
  else run<false>(r);
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
