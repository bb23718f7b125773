// One GGUF block (32 values) decoded into four 8-lane fp32 vectors with AVX2, the same values as the
// reference: (q - 8) * d, q * d + m (two roundings, no fused multiply-add), q * d. Shared by the
// dequantize kernel and the fused linear's weight-tile decode.
#pragma once

#include "gguf_dequant.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace gguf_avx2 {

// The low 8 bytes of v, signed (Q4_0 after -8, Q8_0) or unsigned (Q4_1), as 8 floats.
template <bool kSigned>
ENGINE_AVX2 inline __m256 bytes8(__m128i v) {
  return _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

template <int kQ>
ENGINE_AVX2 inline void decode_block(const uint8_t* b, __m256 out[4]) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_fp16(b)));
  __m128i q[4];
  if (kQ == kQ8_0) {
    for (int i = 0; i < 4; ++i) q[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (kQ == kQ4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m128i ql = _mm_and_si128(qs, mask), qh = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
    if (kQ == kQ4_0) {
      ql = _mm_sub_epi8(ql, _mm_set1_epi8(8));
      qh = _mm_sub_epi8(qh, _mm_set1_epi8(8));
    }
    q[0] = ql;
    q[1] = _mm_srli_si128(ql, 8);
    q[2] = qh;
    q[3] = _mm_srli_si128(qh, 8);
  }
  if (kQ == kQ4_1) {
    const __m256 m = _mm256_set1_ps(_cvtsh_ss(load_fp16(b + 2)));
    for (int i = 0; i < 4; ++i) out[i] = _mm256_add_ps(_mm256_mul_ps(bytes8<false>(q[i]), d), m);
  } else {
    for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(bytes8<true>(q[i]), d);
  }
}

}  // namespace gguf_avx2
}  // namespace engine_cpu
#endif
