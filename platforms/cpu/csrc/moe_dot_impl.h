// The fused-MoE building blocks (moe.h) written once on vec.h's fixed-width backends and instantiated
// by moe_{avx2,avx512,neon,vsx,rvv}.cpp:
//  * moe_dot: MT rows of x times the kMoePanel = 4 weight rows of a panel, reduced along k in vector
//    lanes, the four sums of a row by V::store_sum4 (a transpose-and-add); bf16 weights widen in
//    registers. The last k % W columns: partial vectors (V::load_n) where W > 4, scalar code on the
//    4-lane backends (at most 3 columns);
//  * moe_gemm (used where it beats dot, AVX-512 today): 8 weight rows x blocks of 16 tokens of x^T,
//    one weight value broadcast against the token vectors;
//  * moe_widen: bf16 to fp32 rows (gemm's weight buffer).
// Register blocking follows the backend's register file (V::kAccRegs < 16: 16 vector registers, AVX2):
// with 32 registers, MT * 4 accumulators (<= 24) + the 4 weight vectors + 1 x vector stay live; with
// 16, at most 3 rows per pass (12 accumulators + 3 x vectors + 1 weight vector), the x rows loaded
// first. kPrefetch: the next panel's weight rows are prefetched as these stream (x86: with few rows of
// x the kernel is bound by memory, and a weight row is too short for the hardware prefetcher to ramp
// up; a prefetch never faults, so a wrong guess costs nothing). Not measured on the other backends,
// so off there.
#include "moe.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including moe_dot_impl.h"
#endif

namespace engine_cpu {
namespace {

template <class V>
ENGINE_VEC_FN inline typename V::F moe_ld(const float* p) { return V::load(p); }
template <class V>
ENGINE_VEC_FN inline typename V::F moe_ld(const uint16_t* p) { return V::load_bf16(p); }
template <class V>
ENGINE_VEC_FN inline typename V::F moe_ld_n(const float* p, size_t n) { return V::load_n(p, n); }
template <class V>
ENGINE_VEC_FN inline typename V::F moe_ld_n(const uint16_t* p, size_t n) { return V::load_bf16_n(p, n); }
inline float moe_f32(float v) { return v; }
inline float moe_f32(uint16_t v) { return bf16_to_f32(v); }

template <class V, typename W, int MT, int U, bool kPrefetch>
ENGINE_VEC_FN void moe_dot_t(const float* x, int64_t xs, const W* const* w, int64_t k, float* out) {
  static_assert(kMoePanel == 4, "four weight rows per panel");
  using F = typename V::F;
  constexpr int L = V::W;
  constexpr bool kFewRegs = V::kAccRegs < 16;
  const W *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  const int64_t ahead = 4 * (w1 - w0);  // the next panel's rows (4 rows on, the usual order of calls)
  F acc[U][MT][4];
#pragma GCC unroll 16
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[u][i][j] = V::zero();
  const int64_t body = k / (L * U) * (L * U);
  for (int64_t c = 0; c < body; c += L * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + L * u;
      if constexpr (kPrefetch && (kFewRegs || MT <= 4)) {
        __builtin_prefetch(w0 + cc + ahead, 0, 3);
        __builtin_prefetch(w1 + cc + ahead, 0, 3);
        __builtin_prefetch(w2 + cc + ahead, 0, 3);
        __builtin_prefetch(w3 + cc + ahead, 0, 3);
      }
      if constexpr (kFewRegs) {
        F xv[MT];
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) xv[i] = V::load(x + i * xs + cc);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const F wv = moe_ld<V>(w[j] + cc);
#pragma GCC unroll 8
          for (int i = 0; i < MT; ++i) acc[u][i][j] = V::fma(wv, xv[i], acc[u][i][j]);
        }
      } else {
        const F v0 = moe_ld<V>(w0 + cc), v1 = moe_ld<V>(w1 + cc), v2 = moe_ld<V>(w2 + cc), v3 = moe_ld<V>(w3 + cc);
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const F xv = V::load(x + i * xs + cc);
          acc[u][i][0] = V::fma(v0, xv, acc[u][i][0]);
          acc[u][i][1] = V::fma(v1, xv, acc[u][i][1]);
          acc[u][i][2] = V::fma(v2, xv, acc[u][i][2]);
          acc[u][i][3] = V::fma(v3, xv, acc[u][i][3]);
        }
      }
    }
  }
  if constexpr (L > 4) {
    for (int64_t c = body; c < k; c += L) {  // at most U vectors, the last one partial
      const size_t n = static_cast<size_t>(std::min<int64_t>(L, k - c));
      const F v0 = moe_ld_n<V>(w0 + c, n), v1 = moe_ld_n<V>(w1 + c, n), v2 = moe_ld_n<V>(w2 + c, n),
              v3 = moe_ld_n<V>(w3 + c, n);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const F xv = V::load_n(x + i * xs + c, n);
        acc[0][i][0] = V::fma(v0, xv, acc[0][i][0]);
        acc[0][i][1] = V::fma(v1, xv, acc[0][i][1]);
        acc[0][i][2] = V::fma(v2, xv, acc[0][i][2]);
        acc[0][i][3] = V::fma(v3, xv, acc[0][i][3]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[0][i][j] = V::add(acc[0][i][j], acc[u][i][j]);
    V::store_sum4(out + i * 4, acc[0][i]);
    if constexpr (L == 4) {
      for (int j = 0; j < 4; ++j) {
        float tail = 0.0f;
        for (int64_t c = body; c < k; ++c) tail += x[i * xs + c] * moe_f32(w[j][c]);
        out[i * 4 + j] += tail;
      }
    }
  }
}

template <class V, typename W, bool kPrefetch = false>
ENGINE_VEC_FN void moe_dot(const float* x, int64_t xs, int mt, const W* const* w, int64_t k, float* out) {
  static_assert(kMoePanel == 4 && kMoeMaxMt == 6, "the kernels are written for 4 x (1..6)");
  if constexpr (V::kAccRegs < 16) {  // at most 3 rows per pass
    switch (mt) {
      case 1: return moe_dot_t<V, W, 1, 2, kPrefetch>(x, xs, w, k, out);
      case 2: return moe_dot_t<V, W, 2, 1, kPrefetch>(x, xs, w, k, out);
      case 3: return moe_dot_t<V, W, 3, 1, kPrefetch>(x, xs, w, k, out);
      case 4:
        return moe_dot_t<V, W, 2, 1, kPrefetch>(x, xs, w, k, out),
               moe_dot_t<V, W, 2, 1, kPrefetch>(x + 2 * xs, xs, w, k, out + 8);
      case 5:
        return moe_dot_t<V, W, 3, 1, kPrefetch>(x, xs, w, k, out),
               moe_dot_t<V, W, 2, 1, kPrefetch>(x + 3 * xs, xs, w, k, out + 12);
      default:
        return moe_dot_t<V, W, 3, 1, kPrefetch>(x, xs, w, k, out),
               moe_dot_t<V, W, 3, 1, kPrefetch>(x + 3 * xs, xs, w, k, out + 12);
    }
  } else {
    switch (mt) {
      case 1: return moe_dot_t<V, W, 1, 2, kPrefetch>(x, xs, w, k, out);
      case 2: return moe_dot_t<V, W, 2, 2, kPrefetch>(x, xs, w, k, out);
      case 3: return moe_dot_t<V, W, 3, 1, kPrefetch>(x, xs, w, k, out);
      case 4: return moe_dot_t<V, W, 4, 1, kPrefetch>(x, xs, w, k, out);
      case 5: return moe_dot_t<V, W, 5, 1, kPrefetch>(x, xs, w, k, out);
      default: return moe_dot_t<V, W, 6, 1, kPrefetch>(x, xs, w, k, out);
    }
  }
}

// gemm: 8 weight rows x MV vectors of tokens; a weight value is broadcast (V::set1 of a load: one
// broadcast-from-memory FMA operand on x86) against the token vectors of x^T. 8 * MV accumulators + MV
// x vectors.
template <class V, int MV>
ENGINE_VEC_FN void moe_gemm_t(const float* xt, int64_t ldx, const float* const* w, int64_t k, float* out,
                              int64_t ldo) {
  static_assert(kMoeGemmRows == 8, "the accumulator layout assumes 8 rows");
  using F = typename V::F;
  constexpr int L = V::W;
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4], *w5 = w[5], *w6 = w[6], *w7 = w[7];
  F acc[8][MV];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < MV; ++v) acc[j][v] = V::zero();
  for (int64_t c = 0; c < k; ++c) {
    F xv[MV];
#pragma GCC unroll 4
    for (int v = 0; v < MV; ++v) xv[v] = V::load(xt + c * ldx + L * v);
    const float wv[8] = {w0[c], w1[c], w2[c], w3[c], w4[c], w5[c], w6[c], w7[c]};
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const F b = V::set1(wv[j]);
#pragma GCC unroll 4
      for (int v = 0; v < MV; ++v) acc[j][v] = V::fma(b, xv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < MV; ++v) V::store(out + j * ldo + L * v, acc[j][v]);
}

// Blocks of 48 tokens, the rest as 32 + 32 or 32 or 16 (AVX-512: a 16-token block runs at about 2/3
// the rate). Written for 16-lane vectors (mpad is a multiple of 16, one vector per 16 tokens).
template <class V>
ENGINE_VEC_FN void moe_gemm(const float* xt, int64_t ldx, int64_t mpad, const float* const* w, int64_t k, float* out,
                            int64_t ldo) {
  static_assert(V::W == 16, "moe_gemm takes 16 tokens per vector");
  for (int64_t m0 = 0; m0 < mpad;) {
    const int64_t rest = mpad - m0, take = rest == 64 || rest == 32 ? 32 : rest >= 48 ? 48 : 16;
    if (take == 48) moe_gemm_t<V, 3>(xt + m0, ldx, w, k, out + m0, ldo);
    else if (take == 32) moe_gemm_t<V, 2>(xt + m0, ldx, w, k, out + m0, ldo);
    else moe_gemm_t<V, 1>(xt + m0, ldx, w, k, out + m0, ldo);
    m0 += take;
  }
}

template <class V>
ENGINE_VEC_FN void moe_widen(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += V::W) {
    const size_t m = static_cast<size_t>(std::min<int64_t>(V::W, n - i));
    V::store_n(dst + i, V::load_bf16_n(src + i, m), m);
  }
}

}  // namespace
}  // namespace engine_cpu
