// AVX2 kernels of the Q8-activation GGUF linear: one block (32 int8) per vector; vpmaddubsw + vpmaddwd
// for the block dots. No 16-bit sum can saturate: Q4 weights are 0..15 (15 * 127 * 2 < 32767) and
// Q8_0 multiplies |w| <= 128 by x carrying w's sign (128 * 127 * 2 < 32767).
#include "gguf_dequant.h"
#include "gguf_q8act.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

constexpr int kLanes = 8;

ENGINE_AVX2 void quantize(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int u = 0; u < 4; ++u) {
      v[u] = _mm256_loadu_ps(x + 32 * b + 8 * u);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[u]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float db = _mm_cvtss_f32(h) / 127.0f;
    const __m256 inv = _mm256_set1_ps(db > 0.0f ? 1.0f / db : 0.0f);
    __m256i qi[4], sum = _mm256_setzero_si256();
    for (int u = 0; u < 4; ++u) {
      qi[u] = _mm256_cvtps_epi32(_mm256_mul_ps(v[u], inv));  // half to even, |.| <= 127
      sum = _mm256_add_epi32(sum, qi[u]);
    }
    // Pack 32 lanes of int32 to int8 in order: packs interleave 128-bit halves, the permute undoes it.
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), p8);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    const float sb = db * static_cast<float>(_mm_cvtsi128_si32(t));
    _mm256_storeu_ps(d + kLanes * b, _mm256_set1_ps(db));
    _mm256_storeu_ps(s + kLanes * b, _mm256_set1_ps(sb / kLanes));
  }
}

template <int kQ, int MT>
ENGINE_AVX2 void tile_t(const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, float* out,
                        const float* lut) {
  const int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  const int64_t nb = x.k / 32, dstride = nb * kLanes;
  const uint8_t* wr[4];
  for (int j = 0; j < 4; ++j) wr[j] = w + (j < rows ? j : rows - 1) * ws;
  const int8_t* xq = x.q + x0 * x.k;
  const float* xd = x.d + x0 * dstride;
  const float* xs = x.s + x0 * dstride;
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0f);
  __m256 acc[MT][4];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const uint8_t* p = wr[j] + b * bb;
      _mm_prefetch(reinterpret_cast<const char*>(p + 4 * ws), _MM_HINT_T0);
      __m256i wv, raw = _mm256_setzero_si256();
      if (kQ == kQ8_0) {
        raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
        wv = _mm256_abs_epi8(raw);
      } else {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (kQ == kQ4_1 ? 4 : 2)));
        wv = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1), low4);
      }
      const __m256 dw = _mm256_set1_ps(lut[load_fp16(p)]);
      const __m256 mw = kQ == kQ4_1 ? _mm256_set1_ps(lut[load_fp16(p + 2)]) : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
#pragma GCC unroll 4
      for (int i = 0; i < MT; ++i) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * x.k + 32 * b));
        if (kQ == kQ8_0) xv = _mm256_sign_epi8(xv, raw);
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones));
        acc[i][j] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dw, _mm256_loadu_ps(xd + i * dstride + kLanes * b)), acc[i][j]);
        if (kQ != kQ8_0)
          acc[i][j] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + i * dstride + kLanes * b), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < 4; ++j) out[i * 4 + j] = hsum8(acc[i][j]);
}

void tile(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, int mt, float* out,
          const float* lut) {
  with_qtype(qtype, [&](auto q) {
    constexpr int kQ = decltype(q)::value;
    if (mt == 1) return tile_t<kQ, 1>(w, ws, rows, x, x0, out, lut);
    if (mt == 2) return tile_t<kQ, 2>(w, ws, rows, x, x0, out, lut);
    tile_t<kQ, 3>(w, ws, rows, x, x0, out, lut);
  });
}

}  // namespace

GgufQ8Kernels gguf_q8_kernels_avx2() { return {kLanes, 3, quantize, tile}; }

}  // namespace engine_cpu
#endif  // ENGINE_X86
