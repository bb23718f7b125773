// The fused-MoE `dot` building block (moe.h) written once on vec.h's 4-lane backends and instantiated by
// moe_{neon,vsx,rvv}.cpp (NEON, VSX, RVV at 128-bit vectors): MT rows of x times the kMoePanel = 4
// weight rows of a panel, reduced along k in vector lanes, the four sums of a row by one
// transpose-and-add (V::transpose_add); bf16 weights widen in registers. The last k % 4 columns run in
// scalar code. The x86 kernels (moe_avx2.cpp, moe_avx512.cpp) are still their own sources.
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
inline float moe_f32(float v) { return v; }
inline float moe_f32(uint16_t v) { return bf16_to_f32(v); }

// MT * 4 accumulators (<= 24) + 4 weight vectors + 1 x vector fit 32 registers; U accumulator sets
// for small MT (FMA latency).
template <class V, typename W, int MT, int U>
ENGINE_VEC_FN void moe_dot_t(const float* x, int64_t xs, const W* const* w, int64_t k, float* out) {
  static_assert(V::W == kMoePanel, "one lane per weight row of the panel");
  using F = typename V::F;
  const W *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  F acc[U][MT][4];
  for (int u = 0; u < U; ++u)
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < 4; ++j) acc[u][i][j] = V::zero();
  const int64_t body = k / (4 * U) * (4 * U);
  for (int64_t c = 0; c < body; c += 4 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 4 * u;
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
  for (int i = 0; i < MT; ++i) {
    for (int u = 1; u < U; ++u)
      for (int j = 0; j < 4; ++j) acc[0][i][j] = V::add(acc[0][i][j], acc[u][i][j]);
    V::store(out + i * 4, V::transpose_add(acc[0][i]));
    for (int j = 0; j < 4; ++j) {
      float tail = 0.0f;
      for (int64_t c = body; c < k; ++c) tail += x[i * xs + c] * moe_f32(w[j][c]);
      out[i * 4 + j] += tail;
    }
  }
}

template <class V, typename W>
ENGINE_VEC_FN void moe_dot(const float* x, int64_t xs, int mt, const W* const* w, int64_t k, float* out) {
  static_assert(kMoePanel == 4 && kMoeMaxMt == 6, "the kernels are written for 4 x (1..6)");
  switch (mt) {
    case 1: return moe_dot_t<V, W, 1, 2>(x, xs, w, k, out);
    case 2: return moe_dot_t<V, W, 2, 2>(x, xs, w, k, out);
    case 3: return moe_dot_t<V, W, 3, 1>(x, xs, w, k, out);
    case 4: return moe_dot_t<V, W, 4, 1>(x, xs, w, k, out);
    case 5: return moe_dot_t<V, W, 5, 1>(x, xs, w, k, out);
    default: return moe_dot_t<V, W, 6, 1>(x, xs, w, k, out);
  }
}

}  // namespace
}  // namespace engine_cpu
