// AVX-512 fused_moe kernels: 16 fp32 lanes, the last k % 16 columns under a mask.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers seed results with _mm512_undefined_*() and then warn about it once the
// intrinsics are inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "moe.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

ENGINE_AVX512 inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
ENGINE_AVX512 inline __m512 load(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
ENGINE_AVX512 inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
ENGINE_AVX512 inline __m512 load(const uint16_t* p, __mmask16 m) { return bf16x16_load(p, m); }

// MT rows of x times 4 weight rows: MT * 4 accumulators (<= 24) + 4 weight vectors + 1 x vector fit
// the 32 registers; U independent accumulator sets hide the FMA latency when MT is small.
template <typename W, int MT, int U>
ENGINE_AVX512 void dot_t(const float* x, int64_t xs, const W* const* w, int64_t k, float* out) {
  const W *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  // The next panel's rows (4 rows on, the usual order of calls) are prefetched as these stream: with
  // few rows of x the kernel is bound by memory, and each weight row is too short for the hardware
  // prefetcher to ramp up on its own. A prefetch never faults, so a wrong guess costs nothing.
  const int64_t ahead = 4 * (w1 - w0);
  __m512 acc[U][MT][4];
#pragma GCC unroll 64
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 64
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[u][i][j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 * U <= k; c += 16 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 16 * u;
      if (MT <= 4) {
        _mm_prefetch(reinterpret_cast<const char*>(w0 + cc + ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w1 + cc + ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w2 + cc + ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w3 + cc + ahead), _MM_HINT_T0);
      }
      const __m512 v0 = load(w0 + cc), v1 = load(w1 + cc), v2 = load(w2 + cc), v3 = load(w3 + cc);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * xs + cc);
        acc[u][i][0] = _mm512_fmadd_ps(v0, xv, acc[u][i][0]);
        acc[u][i][1] = _mm512_fmadd_ps(v1, xv, acc[u][i][1]);
        acc[u][i][2] = _mm512_fmadd_ps(v2, xv, acc[u][i][2]);
        acc[u][i][3] = _mm512_fmadd_ps(v3, xv, acc[u][i][3]);
      }
    }
  }
  for (; c < k; c += 16) {  // at most U chunks, the last one partial
    const __mmask16 m = tail_mask(k - c);
    const __m512 v0 = load(w0 + c, m), v1 = load(w1 + c, m), v2 = load(w2 + c, m), v3 = load(w3 + c, m);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * xs + c);
      acc[0][i][0] = _mm512_fmadd_ps(v0, xv, acc[0][i][0]);
      acc[0][i][1] = _mm512_fmadd_ps(v1, xv, acc[0][i][1]);
      acc[0][i][2] = _mm512_fmadd_ps(v2, xv, acc[0][i][2]);
      acc[0][i][3] = _mm512_fmadd_ps(v3, xv, acc[0][i][3]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[0][i][j] = _mm512_add_ps(acc[0][i][j], acc[u][i][j]);
    _mm_storeu_ps(out + i * 4, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
  }
}

template <typename W>
void dot(const float* x, int64_t xs, int mt, const W* const* w, int64_t k, float* out) {
  static_assert(kMoePanel == 4 && kMoeMaxMt == 6, "the kernels are written for 4 x (1..6)");
  switch (mt) {
    case 1: return dot_t<W, 1, 2>(x, xs, w, k, out);
    case 2: return dot_t<W, 2, 2>(x, xs, w, k, out);
    case 3: return dot_t<W, 3, 1>(x, xs, w, k, out);
    case 4: return dot_t<W, 4, 1>(x, xs, w, k, out);
    case 5: return dot_t<W, 5, 1>(x, xs, w, k, out);
    default: return dot_t<W, 6, 1>(x, xs, w, k, out);
  }
}

// gemm: 8 weight rows x MV vectors of 16 tokens; a weight value is broadcast straight from memory
// (vfmadd231ps with {1to16}) against the token vectors of x^T. 8 * MV accumulators + MV x vectors.
template <int MV>
ENGINE_AVX512 void gemm_t(const float* xt, int64_t ldx, const float* const* w, int64_t k, float* out, int64_t ldo) {
  static_assert(kMoeGemmRows == 8, "the accumulator layout assumes 8 rows");
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5], *w6 = w[6], *w7 = w[7];
  __m512 acc[8][MV];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; ++c) {
    __m512 xv[MV];
#pragma GCC unroll 4
    for (int v = 0; v < MV; ++v) xv[v] = _mm512_loadu_ps(xt + c * ldx + 16 * v);
    const float wv[8] = {w0[c], w1[c], w2[c], w3[c], w4[c], w5[c], w6[c], w7[c]};
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512 b = _mm512_set1_ps(wv[j]);
#pragma GCC unroll 4
      for (int v = 0; v < MV; ++v) acc[j][v] = _mm512_fmadd_ps(b, xv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < MV; ++v) _mm512_storeu_ps(out + j * ldo + 16 * v, acc[j][v]);
}

// Blocks of 48 tokens, the rest as 32 + 32 or 32 or 16 (a 16-token block runs at about 2/3 the rate).
void gemm(const float* xt, int64_t ldx, int64_t mpad, const float* const* w, int64_t k, float* out, int64_t ldo) {
  for (int64_t m0 = 0; m0 < mpad;) {
    const int64_t rest = mpad - m0, take = rest == 64 || rest == 32 ? 32 : rest >= 48 ? 48 : 16;
    if (take == 48) gemm_t<3>(xt + m0, ldx, w, k, out + m0, ldo);
    else if (take == 32) gemm_t<2>(xt + m0, ldx, w, k, out + m0, ldo);
    else gemm_t<1>(xt + m0, ldx, w, k, out + m0, ldo);
    m0 += take;
  }
}

ENGINE_AVX512 void widen(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, bf16x16_load(src + i, m));
  }
}

}  // namespace

MoeKernels moe_kernels_avx512() { return {dot<float>, dot<uint16_t>, gemm, widen, silu_and_mul_avx512}; }

}  // namespace engine_cpu
#endif  // ENGINE_X86
