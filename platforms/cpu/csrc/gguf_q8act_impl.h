// The Q8-activation GGUF tile (gguf_q8act.h's `tile`), written once on the vector layer: V (vec.h) gives
// the fp32 lanes, D the int8 block dot (Q8Ops<V> in gguf_vec.h, or the NEON dotprod policy), and kL is the
// layout of x's block scales (x.lanes: W copies per block, loaded as a vector, or 1, broadcast).
// Instantiated by gguf_q8act_{scalar,avx2,neon,neon_dotprod,vsx}.cpp after defining ENGINE_VEC_FN; the AVX-512
// VNNI tile (two blocks per 512-bit vector) stays in gguf_q8act_avx512.cpp.
//
// A block contributes d_w * d_x * sum(q_w * q_x) + m_w * d_x * sum(q_x): the integer dot is exact, spread
// over W lanes and converted once; s (= d_x * sum(q_x), or that / W per copy) carries the second term.
#include "gguf_dequant.h"
#include "gguf_q8act.h"
#include "gguf_vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including gguf_q8act_impl.h"
#endif

namespace engine_cpu {
namespace {

// Rows of x per tile call: 4 accumulators per row plus the weight and scale operands in twice kAccRegs
// vector registers, at most 6.
template <class V>
constexpr int kQ8TileRows = (2 * V::kAccRegs - 4) / 4 < 6 ? (2 * V::kAccRegs - 4) / 4 : 6;

template <class V, class D, int kL, int kQ, int MT>
ENGINE_VEC_FN void q8_tile_t(const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, float* out,
                             const float* lut) {
  static_assert(kQ8PanelRows == 4, "the accumulator layout assumes 4 weight rows");
  using F = typename V::F;
  constexpr int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  const int64_t nb = x.k / 32, dstride = nb * kL;
  const uint8_t* wr[4];
  for (int j = 0; j < 4; ++j) wr[j] = w + (j < rows ? j : rows - 1) * ws;  // rows past `rows`: discarded
  const int8_t* xq = x.q + x0 * x.k;
  const float* xd = x.d + x0 * dstride;
  const float* xs = x.s + x0 * dstride;
  F acc[MT][4];
  #pragma GCC unroll 8
  for (int i = 0; i < MT; ++i)
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = V::zero();
  for (int64_t b = 0; b < nb; ++b) {
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const uint8_t* p = wr[j] + b * bb;
      __builtin_prefetch(p + 4 * ws, 0, 3);  // the next panel's rows
      const typename D::Wt wt = D::template load_w<kQ>(p + (kQ == kQ4_1 ? 4 : 2));
      const F dw = V::set1(lut[load_fp16(p)]);
      const F mw = kQ == kQ4_1 ? V::set1(lut[load_fp16(p + 2)]) : V::mul(dw, V::set1(-8.0f));
      #pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const F dot = D::template dot<kQ>(wt, xq + i * x.k + 32 * b);
        const F dx = kL == 1 ? V::set1(xd[i * dstride + b]) : V::load(xd + i * dstride + kL * b);
        acc[i][j] = V::fma(dot, V::mul(dw, dx), acc[i][j]);
        if constexpr (kQ != kQ8_0) {
          // One scale per block (kL = 1) is spread over the W lanes that the final sum adds up.
          const F sx = kL == 1 ? V::set1(xs[i * dstride + b] * (1.0f / V::W)) : V::load(xs + i * dstride + kL * b);
          acc[i][j] = V::fma(mw, sx, acc[i][j]);
        }
      }
    }
  }
  #pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) QuantOps<V>::reduce4(acc[i], out + i * 4);
}

template <class V, class D, int kL, int kQ, int MT>
ENGINE_VEC_FN inline void q8_tile_rows(int mt, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                                       float* out, const float* lut) {
  if constexpr (MT > 1) {
    if (mt < MT) return q8_tile_rows<V, D, kL, kQ, MT - 1>(mt, w, ws, rows, x, x0, out, lut);
  }
  q8_tile_t<V, D, kL, kQ, MT>(w, ws, rows, x, x0, out, lut);
}

// mt <= kQ8TileRows<V> rows of x (from row x0) against `rows` <= 4 weight rows.
template <class V, class D, int kL>
ENGINE_VEC_FN void q8_tile_impl(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                                int mt, float* out, const float* lut) {
  with_qtype(qtype, [&](auto q) {
    q8_tile_rows<V, D, kL, decltype(q)::value, kQ8TileRows<V>>(mt, w, ws, rows, x, x0, out, lut);
  });
}

}  // namespace
}  // namespace engine_cpu
