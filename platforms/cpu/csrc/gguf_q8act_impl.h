// The Q8-activation GGUF kernels (gguf_q8act.h's `quantize` and `tile`), written once on the vector layer:
// V (vec.h) gives the fp32 lanes, the integer block dot (dot_u8s8 / dot_s8s8) and the block loads of
// vec_quant.h; kL is the layout of x's block scales (x.lanes: kL copies per block, W / kQ8Blocks, loaded as
// a vector, or 1, broadcast). Instantiated by gguf_q8act_{scalar,avx2,avx512,neon,neon_dotprod,vsx}.cpp
// after defining ENGINE_VEC_FN (the backend's target attribute); RVV has its own (gguf_linear_rvv.cpp).
//
// A block contributes d_w * d_x * sum(q_w * q_x) + m_w * d_x * sum(q_x): the integer dot is exact, spread
// over the block's lanes and converted once; s (= d_x * sum(q_x), or that / W per copy) carries the second
// term. A step takes V::kQ8Blocks blocks (AVX-512: two blocks per 512-bit vector; the odd last block of a
// row is the same step with the second block zero).
#include "gguf_dequant.h"
#include "gguf_q8act.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including gguf_q8act_impl.h"
#endif

namespace engine_cpu {
namespace {

// x rows -> q, d, s (gguf_q8act.h's contract, to the bit): per block d = max|x| / 127 and
// q = round_half_even(x * (1 / d)), |x * (1 / d)| <= 127 so no clamp is needed; d and s stored kL times.
template <class V, int kL>
ENGINE_VEC_FN void q8_quantize(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  using F = typename V::F;
  constexpr int W = V::W, NC = 32 / W;
  for (int64_t b = 0; b < k / 32; ++b) {
    F v[NC], m = V::zero();
    #pragma GCC unroll 8
    for (int u = 0; u < NC; ++u) {
      v[u] = V::load(x + 32 * b + W * u);
      m = V::max(m, V::abs(v[u]));
    }
    const float db = V::reduce_max(m) / 127.0f;
    const F inv = V::set1(db > 0.0f ? 1.0f / db : 0.0f);
    typename V::I qi[NC], sum = V::zero_i();
    #pragma GCC unroll 8
    for (int u = 0; u < NC; ++u) {
      qi[u] = V::round_i(V::mul(v[u], inv));
      sum = V::add_i(sum, qi[u]);
    }
    V::store_i8_block(q + 32 * b, qi);
    const float sb = db * static_cast<float>(V::reduce_add_i(sum));
    if constexpr (kL == 1) {
      d[b] = db, s[b] = sb;
    } else if constexpr (kL == W) {
      V::store(d + kL * b, V::set1(db)), V::store(s + kL * b, V::set1(sb / kL));
    } else {
      V::store_n(d + kL * b, V::set1(db), kL), V::store_n(s + kL * b, V::set1(sb / kL), kL);
    }
  }
}

// Rows of x per tile call: 4 accumulators per row plus the weight and scale operands in twice kAccRegs
// vector registers, at most 6.
template <class V>
constexpr int kQ8TileRows = (2 * V::kAccRegs - 4) / 4 < 6 ? (2 * V::kAccRegs - 4) / 4 : 6;

// One step: blocks b .. b + N - 1 (N <= kQ8Blocks) of the 4 weight rows against MT rows of x.
template <class V, int kL, int kQ, int MT, int N>
[[gnu::always_inline]] ENGINE_VEC_FN inline void q8_step(typename V::F (&acc)[MT][4], const uint8_t* const* wr,
                                                         int64_t ws, int64_t b, const Q8Rows& x, const int8_t* xq,
                                                         const float* xd, const float* xs, int64_t dstride,
                                                         const float* lut) {
  using F = typename V::F;
  using B = typename V::B;
  constexpr int G = V::kQ8Blocks, R = V::kQ8Regs, BW = 4 * V::W;
  constexpr int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  #pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const uint8_t* p = wr[j] + b * bb;
    __builtin_prefetch(p + 4 * ws, 0, 3);  // the next panel's rows
    B wv[R];
    if constexpr (kQ == kQ8_0) V::template i8_bytes<N>(p + 2, bb, wv);
    else V::template q4_bytes<N>(p + (kQ == kQ4_1 ? 4 : 2), bb, wv);
    // Block scales as scalars (a small array of them costs GPR <-> vector moves with GCC 12).
    const F dw = V::template set1_blocks<N>(lut[load_fp16(p)], N > 1 ? lut[load_fp16(p + bb)] : 0.0f);
    F mw;  // Q4_1's minimum, Q4_0's -8 d
    if constexpr (kQ == kQ4_1)
      mw = V::template set1_blocks<N>(lut[load_fp16(p + 2)], N > 1 ? lut[load_fp16(p + bb + 2)] : 0.0f);
    else
      mw = V::mul(dw, V::set1(-8.0f));
    #pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const int8_t* xp = xq + i * x.k + 32 * b;
      B xv[R];
      if constexpr (N == G) {
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) xv[r] = V::load_b(xp + BW * r);
      } else {
        V::template i8_bytes<N>(reinterpret_cast<const uint8_t*>(xp), 32, xv);
      }
      typename V::I dot = V::zero_i();
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) dot = kQ == kQ8_0 ? V::dot_s8s8(dot, wv[r], xv[r]) : V::dot_u8s8(dot, wv[r], xv[r]);
      const float* dp = xd + i * dstride + kL * b;
      const float* sp = xs + i * dstride + kL * b;
      // kL = 1: one scale per block, broadcast (s spread over the W lanes that the final sum adds up).
      const F dx = kL == 1 ? V::set1(*dp) : N == G ? V::load(dp) : V::load_n(dp, kL * N);
      acc[i][j] = V::fma(V::to_f32(dot), V::mul(dw, dx), acc[i][j]);
      if constexpr (kQ != kQ8_0) {
        const F sx = kL == 1 ? V::set1(*sp * (1.0f / V::W)) : N == G ? V::load(sp) : V::load_n(sp, kL * N);
        acc[i][j] = V::fma(mw, sx, acc[i][j]);
      }
    }
  }
}

template <class V, int kL, int kQ, int MT>
ENGINE_VEC_FN void q8_tile_t(const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, float* out,
                             const float* lut) {
  static_assert(kQ8PanelRows == 4, "the accumulator layout assumes 4 weight rows");
  constexpr int G = V::kQ8Blocks;
  static_assert(G == 1 || G == 2, "the odd-block tail handles at most two blocks per step");
  static_assert(kL == 1 ? G == 1 : kL * G == V::W, "x's scales: one per block, or W / kQ8Blocks copies");
  const int64_t nb = x.k / 32, dstride = nb * kL;
  const uint8_t* wr[4];
  for (int j = 0; j < 4; ++j) wr[j] = w + (j < rows ? j : rows - 1) * ws;  // rows past `rows`: discarded
  const int8_t* xq = x.q + x0 * x.k;
  const float* xd = x.d + x0 * dstride;
  const float* xs = x.s + x0 * dstride;
  typename V::F acc[MT][4];
  #pragma GCC unroll 8
  for (int i = 0; i < MT; ++i)
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = V::zero();
  int64_t b = 0;
  for (; b + G <= nb; b += G) q8_step<V, kL, kQ, MT, G>(acc, wr, ws, b, x, xq, xd, xs, dstride, lut);
  if constexpr (G == 2) {
    if (b < nb) q8_step<V, kL, kQ, MT, 1>(acc, wr, ws, b, x, xq, xd, xs, dstride, lut);
  }
  #pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) V::store_sum4(out + i * 4, acc[i]);
}

template <class V, int kL, int kQ, int MT>
ENGINE_VEC_FN inline void q8_tile_rows(int mt, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                                       float* out, const float* lut) {
  if constexpr (MT > 1) {
    if (mt < MT) return q8_tile_rows<V, kL, kQ, MT - 1>(mt, w, ws, rows, x, x0, out, lut);
  }
  q8_tile_t<V, kL, kQ, MT>(w, ws, rows, x, x0, out, lut);
}

// mt <= kQ8TileRows<V> rows of x (from row x0) against `rows` <= 4 weight rows.
template <class V, int kL>
ENGINE_VEC_FN void q8_tile_impl(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                                int mt, float* out, const float* lut) {
  with_qtype(qtype, [&](auto q) {
    q8_tile_rows<V, kL, decltype(q)::value, kQ8TileRows<V>>(mt, w, ws, rows, x, x0, out, lut);
  });
}

// The kernels of one backend: kL = W / kQ8Blocks copies of each block's scales where a vector of them loads
// directly (x86), 1 (broadcast) on the 4-lane backends.
template <class V, int kL>
GgufQ8Kernels q8_kernels() {
  return {kL, kQ8TileRows<V>, q8_quantize<V, kL>, q8_tile_impl<V, kL>};
}

}  // namespace
}  // namespace engine_cpu
