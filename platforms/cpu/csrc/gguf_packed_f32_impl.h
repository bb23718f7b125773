// The packed fp32-activation tile (gguf_packed.h's layout, gguf_linear's contract), written once on the vector
// layer: an int32 lane of a chunk vector holds 4 bytes of one row's block, so each of its 8 nibbles (Q4) or 4
// bytes (Q8_0) becomes, in one to three instructions, the fp32 values of one block element for W rows at once
// (Q4 with x scaled by 2^-4t, see GgufPackedF32Kernels: nib_f32_in_place, mask and convert, the nibble left in
// place; else nib_f32: AVX-512 a shift and one vpermps from a 16-entry table, which reads only the index's low 4
// bits, scalar shift, mask, convert; s8_f32: shift(s), convert), and one FMA per row of x, x[k] broadcast, adds it
// to that row's block sum. A decoded vector serves all MT rows of x. Per block and row of x:
//   acc += d * sum_j(q_j x_j) + m * sum_j(x_j)
// with q_j the stored code (Q4_0: the table gives u - 8 directly; without a table the sum is seeded with
// -8 sum(x_b), as gguf_linear's gemv does), m = Q4_1's minimum (0 otherwise), sum(x_b) computed once per call
// (PackedF32X::xsum). The reference sums (q_j d + m) x_j in fp32: the same sum, rounded in another order.
// x arrives tiled, [k][MT] per tile of MT rows (PackedF32X), so every x value a block reads sits at a constant
// offset from one pointer (row-major x needs MT row pointers: GCC spilled them, ~40% of the instructions at
// MT = 12). A group of 16 rows is 16 / W vectors wide, done HH at a time (kF32Halves; the next pass finds the
// group in L1). Instantiated by gguf_packed_f32_{scalar,avx2,avx512}.cpp after defining ENGINE_VEC_FN.
#include "gguf_dequant.h"
#include "gguf_packed.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including gguf_packed_f32_impl.h"
#endif

namespace engine_cpu {
namespace {

// Rows of x per tile: MT block sums and MT accumulators live in registers beside ~5 operands (AVX-512 32
// registers, AVX2 16, scalar modelled as 16).
template <class V>
constexpr int kF32TileRows = V::W == 16 ? 12 : V::W == 8 ? 5 : 4;
// (Tried on AVX-512: 16 and 24 rows of x with each decoded vector scaled first, w = q d + m, and no block sums:
// fewer instructions per FMA, yet 4-12% slower at M = 16..64 on Zen 5, so not kept.)
// Rows of x up to which the AVX2 tile runs (gguf_linear's raw-row kernel above; measured on Zen 5).
constexpr int64_t kF32Avx2MaxM = 8;
// Rows of x from which AVX2 decodes each group once (the decode-once path below). A decode layer's linears
// against the raw-row kernel, 2-core Zen 5 forced to AVX2, 2026-12-01: 3.5% faster at M = 12, 12-14% at M = 16
// and 32; 1.4-1.7x slower at M = 4 and 8. On AVX-512 the decode-once path was 25-50% slower than the tile at
// M = 16 and 32 (its embedded-broadcast FMAs leave the tile's in-loop decode nearly free), so it has none.
constexpr int64_t kF32Avx2DenseFrom = 12;
// Independent block-sum chains per row of x: FMA latency x throughput wants ~8 chains in flight (AVX-512 has the
// registers for 8 chains up to MT = 4).
template <class V, int MT>
constexpr int kF32Chains = V::W == 16 ? (MT == 1 ? 8 : MT == 2 ? 4 : MT <= 4 ? 2 : 1) : (MT == 1 ? 2 : 1);
// Vectors of a group done in one pass (HH of its 16 / W): AVX2 takes both halves at once for MT <= 2, sharing each
// x broadcast between two FMAs (it has no broadcast operands); else one vector per pass.
template <class V, int MT>
constexpr int kF32Halves = V::W == 8 && MT <= 2 ? 2 : 1;

// Block b of HH x W rows (quants at q, fp16 scales at d, minimums at m; vector hh W lanes further) against the MT
// rows of a tile of x (xb: its block b, element e of row i at xb[e * MT + i]; xsum: its block sums of block b, row
// i at xsum[i]). kScaled: x is scaled and the nibbles are decoded in place.
template <class V, int kQ, int MT, int HH, bool kScaled>
[[gnu::always_inline]] ENGINE_VEC_FN inline void f32_block(typename V::F (&acc)[HH][MT], const uint8_t* q,
                                                           const uint16_t* d, const uint16_t* m, const float* xb,
                                                           const float* xsum, typename V::F table) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int W = V::W, C = kQ == kQ8_0 ? 8 : 4, T = kQ == kQ8_0 ? 4 : 8, U = kF32Chains<V, MT>;
  constexpr bool kSeed = kQ == kQ4_0 && (kScaled || !V::kNibTable);
  F s[U][HH][MT];
  #pragma GCC unroll 32
  for (int u = 0; u < U; ++u)
    #pragma GCC unroll 32
    for (int h = 0; h < HH; ++h)
      #pragma GCC unroll 32
      for (int i = 0; i < MT; ++i) s[u][h][i] = kSeed && u == 0 ? V::set1(-8.0f * xsum[i]) : V::zero();
  #pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    I v[HH];
    #pragma GCC unroll 4
    for (int h = 0; h < HH; ++h) v[h] = V::load_i(q + 64 * c + 4 * W * h);
    #pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      // Q4: nibble t is byte t / 2's low (element 4c + t / 2) or high (element 16 + 4c + t / 2) half.
      const int e = kQ == kQ8_0 ? 4 * c + t : 4 * c + t / 2 + 16 * (t % 2);
      const int u = (c * T + t) % U;
      F w[HH];
      #pragma GCC unroll 4
      for (int h = 0; h < HH; ++h) {
        if constexpr (kQ == kQ8_0) w[h] = V::s8_f32(v[h], t);
        else if constexpr (kScaled) w[h] = V::nib_f32_in_place(v[h], t);
        else w[h] = V::nib_f32(v[h], t, table);
      }
      #pragma GCC unroll 32
      for (int i = 0; i < MT; ++i) {
        const F xv = V::set1(xb[e * MT + i]);
        #pragma GCC unroll 4
        for (int h = 0; h < HH; ++h) s[u][h][i] = V::fma(w[h], xv, s[u][h][i]);
      }
    }
  }
  #pragma GCC unroll 4
  for (int h = 0; h < HH; ++h) {
    const F dw = V::load_fp16(d + W * h);
    #pragma GCC unroll 32
    for (int i = 0; i < MT; ++i) {
      F t = s[0][h][i];
      #pragma GCC unroll 8  // fully: a loop left here kept the chains in memory (AVX-512, M = 1: 25% slower)
      for (int u = 1; u < U; ++u) t = V::add(t, s[u][h][i]);
      acc[h][i] = V::fma(t, dw, acc[h][i]);
    }
    if constexpr (kQ == kQ4_1) {
      const F mw = V::load_fp16(m + W * h);
      #pragma GCC unroll 32
      for (int i = 0; i < MT; ++i) acc[h][i] = V::fma(mw, V::set1(xsum[i]), acc[h][i]);
    }
  }
}

template <class V, int kQ, int MT, bool kScaled>
ENGINE_VEC_FN void f32_tile_t(const uint8_t* g, const PackedF32X& x, int64_t x0, float* out) {
  using F = typename V::F;
  constexpr int W = V::W, HH = kF32Halves<V, MT>, H = kPackRows / W / HH;
  constexpr int QB = gguf_packed_quant_bytes(kQ), PB = gguf_packed_pair_bytes(kQ);
  const int64_t nb = x.k / 32;
  const float* xr = x.x + x0 * x.k;        // the tile, [k][MT]
  const float* xsum = x.xsum + x0 * nb;  // [nb][MT]
  const F table = V::nib_table(kQ == kQ4_0 ? -8.0f : 0.0f);
  #pragma GCC unroll 1
  for (int h = 0; h < H; ++h) {
    F acc[HH][MT];
    #pragma GCC unroll 4
    for (int hh = 0; hh < HH; ++hh)
      #pragma GCC unroll 32
      for (int i = 0; i < MT; ++i) acc[hh][i] = V::zero();
    const uint8_t* p = g + 4 * W * HH * h;                                        // quants of a pair's first block
    const uint16_t* s = reinterpret_cast<const uint16_t*>(g + 2 * QB) + W * HH * h;  // its scales
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, p += PB, s += PB / 2) {
      #pragma GCC unroll 16
      for (int o = 0; o < PB; o += 64) __builtin_prefetch(p + kPackedPrefetchBytes + o);
      f32_block<V, kQ, MT, HH, kScaled>(acc, p, s, s + 2 * kPackRows, xr + 32 * MT * b, xsum + MT * b, table);
      f32_block<V, kQ, MT, HH, kScaled>(acc, p + QB, s + kPackRows, s + 3 * kPackRows, xr + 32 * MT * (b + 1),
                                        xsum + MT * (b + 1), table);
    }
    if (b < nb)
      f32_block<V, kQ, MT, HH, kScaled>(acc, p, s, s + 2 * kPackRows, xr + 32 * MT * b, xsum + MT * b, table);
    #pragma GCC unroll 4
    for (int hh = 0; hh < HH; ++hh)
      #pragma GCC unroll 32
      for (int i = 0; i < MT; ++i) V::store(out + i * kPackRows + W * (HH * h + hh), acc[hh][i]);
  }
}

template <class V, int kQ, int MT, bool kScaled>
ENGINE_VEC_FN inline void f32_tile_rows(int mt, const uint8_t* g, const PackedF32X& x, int64_t x0, float* out) {
  if constexpr (MT > 1) {
    if (mt < MT) return f32_tile_rows<V, kQ, MT - 1, kScaled>(mt, g, x, x0, out);
  }
  f32_tile_t<V, kQ, MT, kScaled>(g, x, x0, out);
}

// Rows of x from which Q4 tiles decode in place, x scaled. AVX-512 keeps the table at one row: in place (a mask and
// a convert instead of a shift and a vpermps) ran a call 5-10% faster at one row and ~20% at four with the weights
// hot, but at one row with the weights in DRAM it lost ~5% a layer to the scaled copy of x it needs, while four
// rows gained 8-10% there (2-core Zen 5, 2026-12-02).
template <class V>
constexpr int64_t kF32ScaledFrom = V::kNibScaled ? 1 : V::kNibInPlace ? 2 : int64_t{1} << 62;

template <class V>
ENGINE_VEC_FN void f32_tile_impl(int qtype, const uint8_t* g, const PackedF32X& x, int64_t x0, int mt, float* out) {
  with_qtype(qtype, [&](auto q) {
    constexpr int kQ = decltype(q)::value, MT = kF32TileRows<V>;
    // The driver scales a Q4 x from kF32ScaledFrom rows (GgufPackedF32Kernels::scaled_from), so an unscaled Q4 x on
    // a backend with in-place nibbles and a table (AVX-512) is one row: only that tile is instantiated.
    if constexpr (kQ == kQ8_0 || !V::kNibInPlace) f32_tile_rows<V, kQ, MT, false>(mt, g, x, x0, out);
    else if constexpr (V::kNibScaled) f32_tile_rows<V, kQ, MT, true>(mt, g, x, x0, out);
    else if (x.scaled) f32_tile_rows<V, kQ, MT, true>(mt, g, x, x0, out);
    else f32_tile_t<V, kQ, 1, false>(g, x, x0, out);
  });
}

// The decode-once path (many rows of x): a group's weights are decoded to fp32 once, w = q d + m as the reference
// dequantizes them, into buf [k][16] (element c of the 16 rows at buf + 16 c), and every tile of x then runs a
// plain fp32 microkernel on them: per element of k, 16 / W weight loads and MT broadcasts feed MT x 16 / W FMAs,
// with no decode in the loop. Only AVX2 uses it (kF32Avx2DenseFrom).
template <class V, int kQ>
ENGINE_VEC_FN void f32_decode_group_t(const uint8_t* g, int64_t nb, float* buf) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int W = V::W, H = kPackRows / W, C = kQ == kQ8_0 ? 8 : 4, T = kQ == kQ8_0 ? 4 : 8;
  constexpr int QB = gguf_packed_quant_bytes(kQ), PB = gguf_packed_pair_bytes(kQ);
  const F table = V::nib_table(kQ == kQ4_0 ? -8.0f : 0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b / 2 * PB + b % 2 * QB;
    const uint16_t* sd = reinterpret_cast<const uint16_t*>(g + b / 2 * PB + 2 * QB) + b % 2 * kPackRows;
    float* out = buf + 32 * kPackRows * b;
    #pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const F d = V::load_fp16(sd + W * h);
      // Q4_1's minimum; Q4_0 without a table: -8 d (its nibble is u, not u - 8).
      const F lo = kQ == kQ4_1 ? V::load_fp16(sd + 2 * kPackRows + W * h)
                   : kQ == kQ4_0 && !V::kNibTable ? V::mul(d, V::set1(-8.0f)) : V::zero();
      #pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const I v = V::load_i(p + 64 * c + 4 * W * h);
        #pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const int e = kQ == kQ8_0 ? 4 * c + t : 4 * c + t / 2 + 16 * (t % 2);
          F w;
          if constexpr (kQ == kQ8_0) {
            w = V::mul(V::s8_f32(v, t), d);
          } else {
            const float sc = V::kNibScaled && t < 7 ? 1.0f / float(1 << (4 * t)) : 1.0f;  // exact powers of 2
            const F q = V::nib_f32(v, t, table);
            w = kQ == kQ4_0 && V::kNibTable ? V::mul(q, d) : V::fma(q, sc == 1.0f ? d : V::mul(d, V::set1(sc)), lo);
          }
          V::store(out + kPackRows * e + W * h, w);
        }
      }
    }
  }
}

// Rows of x per AVX2 decode-once tile: 6 x 2 accumulators beside 2 weight vectors and a broadcast (16 registers).
constexpr int kF32Avx2DenseRows = 6;

template <class V, int MT>
ENGINE_VEC_FN void f32_dense_tile_t(const float* buf, int64_t k, const float* xt, float* out) {
  using F = typename V::F;
  constexpr int W = V::W, H = kPackRows / W;
  F acc[H][MT];
  #pragma GCC unroll 4
  for (int h = 0; h < H; ++h)
    #pragma GCC unroll 32
    for (int i = 0; i < MT; ++i) acc[h][i] = V::zero();
  for (int64_t c = 0; c < k; ++c) {
    F w[H];
    #pragma GCC unroll 4
    for (int h = 0; h < H; ++h) w[h] = V::load(buf + kPackRows * c + W * h);
    #pragma GCC unroll 32
    for (int i = 0; i < MT; ++i) {
      const F xv = V::set1(xt[c * MT + i]);
      #pragma GCC unroll 4
      for (int h = 0; h < H; ++h) acc[h][i] = V::fma(w[h], xv, acc[h][i]);
    }
  }
  #pragma GCC unroll 4
  for (int h = 0; h < H; ++h)
    #pragma GCC unroll 32
    for (int i = 0; i < MT; ++i) V::store(out + i * kPackRows + W * h, acc[h][i]);
}

template <class V, int MT>
ENGINE_VEC_FN inline void f32_dense_rows(int mt, const float* buf, int64_t k, const float* xt, float* out) {
  if constexpr (MT > 1) {
    if (mt < MT) return f32_dense_rows<V, MT - 1>(mt, buf, k, xt, out);
  }
  f32_dense_tile_t<V, MT>(buf, k, xt, out);
}

template <class V>
ENGINE_VEC_FN void f32_decode_group_impl(int qtype, const uint8_t* g, int64_t nb, float* buf) {
  with_qtype(qtype, [&](auto q) { f32_decode_group_t<V, decltype(q)::value>(g, nb, buf); });
}

template <class V>
ENGINE_VEC_FN void f32_dense_tile_impl(const float* buf, int64_t k, const float* xt, int mt, float* out) {
  f32_dense_rows<V, kF32Avx2DenseRows>(mt, buf, k, xt, out);
}

template <class V>
GgufPackedF32Kernels packed_f32_kernels() {
  static_assert(kF32TileRows<V> <= kPackedF32MaxTileRows && kF32Avx2DenseRows <= kPackedF32MaxTileRows,
                "the driver's tile buffer holds kPackedF32MaxTileRows rows");
  // AVX2 beats the raw-row kernel (gguf_linear.h's 4-row panels, x loads shared by 4 FMAs) only at small M:
  // without embedded broadcasts each x value costs a broadcast per FMA here.
  GgufPackedF32Kernels k{kF32TileRows<V>, kF32ScaledFrom<V>, V::W == 8 ? kF32Avx2MaxM : int64_t{1} << 30,
                         f32_tile_impl<V>, int64_t{1} << 62, 0, nullptr, nullptr};
  if constexpr (V::W == 8) {
    k.dense_from = kF32Avx2DenseFrom;
    k.dense_mt = kF32Avx2DenseRows;
    k.decode_group = f32_decode_group_impl<V>;
    k.dense_tile = f32_dense_tile_impl<V>;
  }
  return k;
}

}  // namespace
}  // namespace engine_cpu
