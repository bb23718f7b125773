// AVX2 RMSNorm: 8 lanes; the last hidden % 8 elements go through a zero-padded 8-lane buffer.
#include <cmath>

#include "rms_norm.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX2 inline __m256 ld(const void* p, int64_t i, int64_t n) {
  if (n >= 8) {
    if (kBf16) return bf16x8_load(static_cast<const uint16_t*>(p) + i);
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  }
  alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < n; ++j)
    buf[j] = kBf16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[i + j]) : static_cast<const float*>(p)[i + j];
  return _mm256_load_ps(buf);
}

// Stores the first min(n, 8) lanes of v; returns the value as stored (bf16-rounded for bf16).
template <bool kBf16>
ENGINE_AVX2 inline __m256 st(void* p, int64_t i, __m256 v, int64_t n) {
  if (kBf16) v = bf16x8_roundtrip(v);
  if (n >= 8) {
    if (kBf16) bf16x8_store(static_cast<uint16_t*>(p) + i, v);  // exact: v is already bf16
    else _mm256_storeu_ps(static_cast<float*>(p) + i, v);
    return v;
  }
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  for (int64_t j = 0; j < n; ++j) {
    if (kBf16) static_cast<uint16_t*>(p)[i + j] = static_cast<uint16_t>(f32_to_bits(buf[j]) >> 16);
    else static_cast<float*>(p)[i + j] = buf[j];
  }
  return v;
}

template <bool kBf16>
ENGINE_AVX2 void run(const RmsNormArgs& a) {
  const int64_t h = a.hidden, es = kBf16 ? 2 : 4;
  for (int64_t r = 0; r < a.rows; ++r) {
    const char* x = static_cast<const char*>(a.x) + r * a.x_stride * es;
    const void* src = x;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    if (a.res != nullptr) {
      const char* res = static_cast<const char*>(a.res) + r * a.res_stride * es;
      char* s = static_cast<char*>(a.sum_out) + r * a.sum_stride * es;
      for (int64_t i = 0; i < h; i += 8) {
        const __m256 v = st<kBf16>(s, i, _mm256_add_ps(ld<kBf16>(x, i, h - i), ld<kBf16>(res, i, h - i)), h - i);
        if ((i >> 3) & 1) acc1 = _mm256_fmadd_ps(v, v, acc1);
        else acc0 = _mm256_fmadd_ps(v, v, acc0);
      }
      src = s;
    } else {
      for (int64_t i = 0; i < h; i += 8) {
        const __m256 v = ld<kBf16>(x, i, h - i);
        if ((i >> 3) & 1) acc1 = _mm256_fmadd_ps(v, v, acc1);
        else acc0 = _mm256_fmadd_ps(v, v, acc0);
      }
    }
    const float ss = hsum8(_mm256_add_ps(acc0, acc1));
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(ss / static_cast<float>(h) + a.eps));
    char* out = static_cast<char*>(a.out) + r * a.out_stride * es;
    for (int64_t i = 0; i < h; i += 8) {
      const __m256 y = _mm256_mul_ps(_mm256_mul_ps(ld<kBf16>(src, i, h - i), inv), ld<kBf16>(a.w, i, h - i));
      st<kBf16>(out, i, y, h - i);
    }
  }
}

}  // namespace

void rms_norm_avx2(const RmsNormArgs& a) {
  if (a.dtype == DType::BF16) run<true>(a);
  else run<false>(a);
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
