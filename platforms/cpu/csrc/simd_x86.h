// x86 SIMD helpers compiled per function with target attributes (no global -mavx flags), so that
// one binary runs everywhere and picks its variant at run time. Include only from *_avx2.cpp /
// *_avx512.cpp files, inside #ifdef ENGINE_X86. Everything here is static (internal linkage):
// no ISA-specific code can leak into a shared inline definition.
#pragma once

#include "isa.h"

#ifdef ENGINE_X86
#include <immintrin.h>

#include <cstdint>

#define ENGINE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ENGINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define ENGINE_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace engine_cpu {
namespace {

// ---- AVX2: 8 floats --------------------------------------------------------------------------
ENGINE_AVX2 inline __m256 bf16x8_load(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Round to nearest even, NaN -> 0x7FC0 (as torch); returns the bf16 bits in the low half of each lane.
ENGINE_AVX2 inline __m256i bf16x8_round(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
}

ENGINE_AVX2 inline void bf16x8_store(uint16_t* p, __m256 v) {
  const __m256i r = bf16x8_round(v);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// The value bf16 storage would hold, as fp32.
ENGINE_AVX2 inline __m256 bf16x8_roundtrip(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16x8_round(v), 16));
}

ENGINE_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- AVX-512: 16 floats, masked tails ---------------------------------------------------------
ENGINE_AVX512 inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

ENGINE_AVX512 inline __m512 bf16x16_load(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

ENGINE_AVX512 inline __m512i bf16x16_round(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
}

ENGINE_AVX512 inline void bf16x16_store(uint16_t* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(bf16x16_round(v)));
}

ENGINE_AVX512 inline __m512 bf16x16_roundtrip(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16x16_round(v), 16));
}

// {sum(a), sum(b), sum(c), sum(d)}.
ENGINE_AVX512 inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Two-source permutes (vpermt2ps) of 128-bit quarters: [x.q0, x.q1, y.q0, y.q1] + [x.q2, x.q3, y.q2, y.q3],
  // then [ab.q0, ab.q2, cd.q0, cd.q2] + [ab.q1, ab.q3, cd.q1, cd.q3].
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const __m512i ev = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i od = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const __m512 ab = _mm512_add_ps(_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b));
  const __m512 cd = _mm512_add_ps(_mm512_permutex2var_ps(c, lo, d), _mm512_permutex2var_ps(c, hi, d));
  // Each 128-bit quarter now holds four partial sums of one of a, b, c, d.
  __m512 s = _mm512_add_ps(_mm512_permutex2var_ps(ab, ev, cd), _mm512_permutex2var_ps(ab, od, cd));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(2, 3, 0, 1)));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                        0, 0), s));
}

}  // namespace
}  // namespace engine_cpu

#endif  // ENGINE_X86
