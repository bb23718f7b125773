// AVX2 fused_moe kernels: 8 fp32 lanes, the last k % 8 columns in scalar code.
#include "moe.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

ENGINE_AVX2 inline __m256 load(const float* p) { return _mm256_loadu_ps(p); }
ENGINE_AVX2 inline __m256 load(const uint16_t* p) { return bf16x8_load(p); }
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

// {sum(a), sum(b), sum(c), sum(d)}.
ENGINE_AVX2 inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// MT rows of x times 4 weight rows; 16 registers hold MT * 4 accumulators (<= 12), the MT x vectors
// and one weight vector at a time. U accumulator sets for MT = 1 (FMA latency).
template <typename W, int MT, int U>
ENGINE_AVX2 void dot_t(const float* x, int64_t xs, const W* const* w, int64_t k, float* out) {
  __m256 acc[U][MT][4];
#pragma GCC unroll 16
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[u][i][j] = _mm256_setzero_ps();
  const int64_t body = k / (8 * U) * (8 * U);
  const int64_t ahead = 4 * (w[1] - w[0]);  // the next panel's rows, as in moe_avx512.cpp
  for (int64_t c = 0; c < body; c += 8 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 8 * u;
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(w[j] + cc + ahead), _MM_HINT_T0);
      __m256 xv[MT];
#pragma GCC unroll 4
      for (int i = 0; i < MT; ++i) xv[i] = _mm256_loadu_ps(x + i * xs + cc);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256 wv = load(w[j] + cc);
#pragma GCC unroll 4
        for (int i = 0; i < MT; ++i) acc[u][i][j] = _mm256_fmadd_ps(wv, xv[i], acc[u][i][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[0][i][j] = _mm256_add_ps(acc[0][i][j], acc[u][i][j]);
    _mm_storeu_ps(out + i * 4, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
    for (int j = 0; j < 4; ++j) {
      float tail = 0.0f;
      for (int64_t c = body; c < k; ++c) tail += x[i * xs + c] * to_f32(w[j][c]);
      out[i * 4 + j] += tail;
    }
  }
}

template <typename W>
void dot(const float* x, int64_t xs, int mt, const W* const* w, int64_t k, float* out) {
  static_assert(kMoePanel == 4 && kMoeMaxMt == 6, "the kernels are written for 4 x (1..6)");
  switch (mt) {
    case 1: return dot_t<W, 1, 2>(x, xs, w, k, out);
    case 2: return dot_t<W, 2, 1>(x, xs, w, k, out);
    case 3: return dot_t<W, 3, 1>(x, xs, w, k, out);
    case 4: return dot_t<W, 2, 1>(x, xs, w, k, out), dot_t<W, 2, 1>(x + 2 * xs, xs, w, k, out + 8);
    case 5: return dot_t<W, 3, 1>(x, xs, w, k, out), dot_t<W, 2, 1>(x + 3 * xs, xs, w, k, out + 12);
    default: return dot_t<W, 3, 1>(x, xs, w, k, out), dot_t<W, 3, 1>(x + 3 * xs, xs, w, k, out + 12);
  }
}

}  // namespace

// No gemm: an 8-lane broadcast kernel (4 rows x 16 tokens) measured 10-20% slower than dot at 64-256
// tokens, so AVX2 runs dot for every M.
MoeKernels moe_kernels_avx2() { return {dot<float>, dot<uint16_t>, nullptr, nullptr, silu_and_mul_avx2}; }

}  // namespace engine_cpu
#endif  // ENGINE_X86
