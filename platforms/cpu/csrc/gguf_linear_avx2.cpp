// AVX2 + FMA kernels for the fused GGUF linear (8 fp32 lanes; a block of 32 = four vectors).
#include "gguf_dequant.h"
#include "gguf_block_avx2.h"
#include "gguf_linear.h"
#include "simd_x86.h"

#include <vector>

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

// Same values as the reference (see gguf_block_avx2.h).
template <int kQ>
ENGINE_AVX2 void decode_q(const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst) {
  const int bb = gguf_block_bytes(kQ);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* b = w + r * w_stride;
    float* out = dst + r * k;
    for (int64_t c = 0; c < k; c += 32, b += bb, out += 32) {
      __m256 v[4];
      gguf_avx2::decode_block<kQ>(b, v);
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, v[i]);
    }
  }
}

// The fp16 scale table is not needed here: F16C converts a block's scale in one instruction.
void decode(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst, const float* /*lut*/) {
  with_qtype(qtype, [&](auto q) { decode_q<decltype(q)::value>(w, w_stride, rows, k, dst); });
}

// {sum(a), sum(b), sum(c), sum(d)}.
ENGINE_AVX2 inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// MT (1 or 2) rows of x against the 4-row panel: 4 * MT * U accumulators + 5 operands <= 16 registers.
template <int MT, int U>
ENGINE_AVX2 void dot_t(const float* x, int64_t xs, const float* w, int64_t k, float* out) {
  __m256 acc[U][MT][4];
  for (int u = 0; u < U; ++u)
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < 4; ++j) acc[u][i][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; c += 8 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 8 * u;
      const __m256 w0 = _mm256_loadu_ps(w + cc), w1 = _mm256_loadu_ps(w + k + cc);
      const __m256 w2 = _mm256_loadu_ps(w + 2 * k + cc), w3 = _mm256_loadu_ps(w + 3 * k + cc);
#pragma GCC unroll 4
      for (int i = 0; i < MT; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * xs + cc);
        acc[u][i][0] = _mm256_fmadd_ps(w0, xv, acc[u][i][0]);
        acc[u][i][1] = _mm256_fmadd_ps(w1, xv, acc[u][i][1]);
        acc[u][i][2] = _mm256_fmadd_ps(w2, xv, acc[u][i][2]);
        acc[u][i][3] = _mm256_fmadd_ps(w3, xv, acc[u][i][3]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int u = 1; u < U; ++u)
      for (int j = 0; j < 4; ++j) acc[0][i][j] = _mm256_add_ps(acc[0][i][j], acc[u][i][j]);
    _mm_storeu_ps(out + i * 4, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
  }
}

void dot(const float* x, int64_t xs, int mt, const float* w, int64_t k, float* out) {
  if (mt == 1) return dot_t<1, 2>(x, xs, w, k, out);
  int i = 0;
  for (; i + 2 <= mt; i += 2) dot_t<2, 1>(x + i * xs, xs, w, k, out + i * 4);
  if (i < mt) dot_t<1, 2>(x + i * xs, xs, w, k, out + i * 4);
}

// M = 1: R rows at once, each block decoded in registers. Per block b of a row the dot product is
// d * (q . x_b) + m * sum(x_b) (Q4_0: m = -8 d), so the 32 values are converted but never scaled;
// xs[b] holds the 8-lane partial sums of x_b (computed once per call).
template <int kQ, int R>
ENGINE_AVX2 void gemv_rows(const uint8_t* w, int64_t w_stride, int64_t k, const float* x, const float* xs,
                           float* out, const float* lut) {
  const int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  const __m256i low4 = _mm256_set1_epi32(0x0f);
  __m256 acc[R], accm[R];
  for (int i = 0; i < R; ++i) acc[i] = accm[i] = _mm256_setzero_ps();
  for (int64_t c = 0, off = 0; c < k; c += 32, off += bb) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
    const __m256 x2 = _mm256_loadu_ps(x + c + 16), x3 = _mm256_loadu_ps(x + c + 24);
    const __m256 xsum = _mm256_loadu_ps(xs + c / 4);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const uint8_t* b = w + i * w_stride + off;
      _mm_prefetch(reinterpret_cast<const char*>(b + R * w_stride), _MM_HINT_T0);
      const float d = lut[load_fp16(b)];
      __m256 q0, q1, q2, q3;
      if (kQ == kQ8_0) {
        q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2))));
        q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 10))));
        q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 18))));
        q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 26))));
      } else {
        const uint8_t* qs = b + (kQ == kQ4_1 ? 4 : 2);
        const __m256i a0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
        const __m256i a1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
        q0 = _mm256_cvtepi32_ps(_mm256_and_si256(a0, low4));  // elements 0..7: low nibbles of bytes 0..7
        q1 = _mm256_cvtepi32_ps(_mm256_and_si256(a1, low4));
        q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(a0, 4));    // elements 16..23: high nibbles
        q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(a1, 4));
      }
      __m256 t = _mm256_mul_ps(q0, x0);
      t = _mm256_fmadd_ps(q1, x1, t);
      t = _mm256_fmadd_ps(q2, x2, t);
      t = _mm256_fmadd_ps(q3, x3, t);
      acc[i] = _mm256_fmadd_ps(t, _mm256_set1_ps(d), acc[i]);
      if (kQ != kQ8_0) {
        const float m = kQ == kQ4_1 ? lut[load_fp16(b + 2)] : -8.0f * d;
        accm[i] = _mm256_fmadd_ps(xsum, _mm256_set1_ps(m), accm[i]);
      }
    }
  }
  if (R == 4) {
    _mm_storeu_ps(out, hsum4(_mm256_add_ps(acc[0], accm[0]), _mm256_add_ps(acc[1 % R], accm[1 % R]),
                             _mm256_add_ps(acc[2 % R], accm[2 % R]), _mm256_add_ps(acc[3 % R], accm[3 % R])));
  } else {
    for (int i = 0; i < R; ++i) {
      const __m256 v = _mm256_add_ps(acc[i], accm[i]);
      out[i] = _mm_cvtss_f32(hsum4(v, v, v, v));
    }
  }
}

// xs[c / 4 + l] = x[c + l] + x[c + 8 + l] + x[c + 16 + l] + x[c + 24 + l] per block c, lane l.
ENGINE_AVX2 void block_sums(const float* x, int64_t k, float* xs) {
  for (int64_t c = 0; c < k; c += 32) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(x + c + 8)),
                                   _mm256_add_ps(_mm256_loadu_ps(x + c + 16), _mm256_loadu_ps(x + c + 24)));
    _mm256_storeu_ps(xs + c / 4, s);
  }
}

template <int kQ>
void gemv_q(const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out, const float* lut) {
  thread_local std::vector<float> xs;
  if (xs.size() < static_cast<size_t>(k / 4)) xs.resize(static_cast<size_t>(k / 4));
  if (kQ != kQ8_0) block_sums(x, k, xs.data());
  int r = 0;
  for (; r + 4 <= rows; r += 4) gemv_rows<kQ, 4>(w + r * w_stride, w_stride, k, x, xs.data(), out + r, lut);
  for (; r < rows; ++r) gemv_rows<kQ, 1>(w + r * w_stride, w_stride, k, x, xs.data(), out + r, lut);
}

void gemv(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out,
          const float* lut) {
  with_qtype(qtype, [&](auto q) { gemv_q<decltype(q)::value>(w, w_stride, rows, k, x, out, lut); });
}

}  // namespace

GgufLinearKernels gguf_linear_kernels_avx2() { return {decode, dot, gemv}; }

}  // namespace engine_cpu
#endif  // ENGINE_X86
