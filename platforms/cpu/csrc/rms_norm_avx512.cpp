// AVX-512 RMSNorm: 16 lanes, masked tails, so any hidden size stays in the vector loop.
#include <cmath>

#include "rms_norm.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX512 inline __m512 ld(const void* p, int64_t i, __mmask16 m) {
  if (kBf16) return bf16x16_load(static_cast<const uint16_t*>(p) + i, m);
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

// Stores v and returns the value as stored (rounded to bf16 for bf16 storage).
template <bool kBf16>
ENGINE_AVX512 inline __m512 st(void* p, int64_t i, __m512 v, __mmask16 m) {
  if (kBf16) {
    const __m512i r = bf16x16_round(v);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, _mm512_cvtepi32_epi16(r));
    return _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
  }
  _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
  return v;
}

template <bool kBf16>
ENGINE_AVX512 void run(const RmsNormArgs& a) {
  const int64_t h = a.hidden, es = kBf16 ? 2 : 4;
  for (int64_t r = 0; r < a.rows; ++r) {
    const char* x = static_cast<const char*>(a.x) + r * a.x_stride * es;
    const void* src = x;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    if (a.res != nullptr) {
      const char* res = static_cast<const char*>(a.res) + r * a.res_stride * es;
      char* s = static_cast<char*>(a.sum_out) + r * a.sum_stride * es;
      for (int64_t i = 0; i < h; i += 16) {
        const __mmask16 m = tail_mask(h - i);
        const __m512 v = st<kBf16>(s, i, _mm512_add_ps(ld<kBf16>(x, i, m), ld<kBf16>(res, i, m)), m);
        if ((i >> 4) & 1) acc1 = _mm512_fmadd_ps(v, v, acc1);
        else acc0 = _mm512_fmadd_ps(v, v, acc0);
      }
      src = s;
    } else {
      for (int64_t i = 0; i < h; i += 16) {
        const __m512 v = ld<kBf16>(x, i, tail_mask(h - i));
        if ((i >> 4) & 1) acc1 = _mm512_fmadd_ps(v, v, acc1);
        else acc0 = _mm512_fmadd_ps(v, v, acc0);
      }
    }
    const float ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(h) + a.eps));
    char* out = static_cast<char*>(a.out) + r * a.out_stride * es;
    for (int64_t i = 0; i < h; i += 16) {
      const __mmask16 m = tail_mask(h - i);
      st<kBf16>(out, i, _mm512_mul_ps(_mm512_mul_ps(ld<kBf16>(src, i, m), inv), ld<kBf16>(a.w, i, m)), m);
    }
  }
}

}  // namespace

void rms_norm_avx512(const RmsNormArgs& a) {
  if (a.dtype == DType::BF16) run<true>(a);
  else run<false>(a);
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
