// Vectorized expf for the AVX2 / AVX-512 kernels (SiLU here, the softmax of paged attention).
// Cephes-style: x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2 is exact), e^r from a
// degree-6 polynomial, then times 2^n; about 2 ulp of relative error. Inputs are clamped to
// [ln 2^-126, ln 2^127] so that 2^n stays a normal float: exp(-inf) gives ~1e-38, not 0 (callers
// that need an exact 0 mask it), exp(+large) gives 1.7e38, not inf. NaN propagates.
// Include only from *_avx2.cpp / *_avx512.cpp files, inside #ifdef ENGINE_X86.
#pragma once

#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

constexpr float kExpLo = -87.33654475f;  // ln(2^-126)
constexpr float kExpHi = 88.02969193f;   // ln(2^127)
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: n * kLn2Hi is exact for |n| <= 128
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

ENGINE_AVX512 inline __m512 exp512(__m512 x) {
  // max/min return their second operand when either is NaN: x goes second so NaN survives.
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), _mm512_max_ps(_mm512_set1_ps(kExpLo), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kP0);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP1));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP2));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP3));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP4));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP5));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

ENGINE_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), _mm256_max_ps(_mm256_set1_ps(kExpLo), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kP0);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP5));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n through the exponent field; n is in [-126, 127] after the clamp (NaN gives garbage * NaN = NaN).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

}  // namespace
}  // namespace engine_cpu
#endif  // ENGINE_X86
