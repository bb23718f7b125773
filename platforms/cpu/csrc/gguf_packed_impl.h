// The packed Q8-activation tile (gguf_packed.h), written once on the vector layer: a vector of B holds one
// 4-byte chunk of a block for W rows (int32 lane = row), x's matching 4 bytes are broadcast (bcast4_b), and
// dot_u8s8 sums 4 products per lane; the W rows' fp16 block scales load as one vector. A group of 16 rows is
// 16 / W vectors wide (AVX-512 one, AVX2 two, scalar four), done one after the other so that only MT
// accumulators live (the second pass finds the group in L1). Instantiated by gguf_packed_{scalar,avx2,avx512}.cpp
// after defining ENGINE_VEC_FN.
//
// Per block: Q4_1 adds d_w * d_x * dot + m_w * s_x; Q4_0 and Q8_0 take their offset in integers, exactly:
// Q4_0's quants are u - 8 (u = nibble), and Q8_0's, where dot_u8s8 takes bytes up to 255 (kDotU8Full), are
// (q ^ 0x80) - 128; so dot(q_w, q_x) = dot(u, q_x) - offset * sum(q_x). Where it does not (AVX2), Q8_0 uses
// dot_s8s8 on the signed quants. Where V has int16 pair sums (kI16Sums, AVX2), a Q4 block's 8 product vectors
// are summed in int16 and widened once.
#include "gguf_dequant.h"
#include "gguf_packed.h"
#include "gguf_q8act_impl.h"  // q8_quantize: the same quantizer as gguf_linear_q8act
#include "vec.h"

namespace engine_cpu {
namespace {

template <class V>
constexpr int kPackedTileRows = V::kAccRegs / 2;

// Block b (quants at q, the rows' scales at d and minimums at m, lanes W h ..) against MT rows of x.
template <class V, int kQ, int MT>
[[gnu::always_inline]] ENGINE_VEC_FN inline void packed_block(typename V::F (&acc)[MT], const uint8_t* q,
                                                              const uint16_t* d, const uint16_t* m, int64_t b,
                                                              const int8_t* xq, int64_t k, const float* xd,
                                                              const float* xs, const int32_t* xi, int64_t nb) {
  using F = typename V::F;
  using I = typename V::I;
  using B = typename V::B;
  constexpr int C = kQ == kQ8_0 ? 8 : 4;
  constexpr bool kQ8Unsigned = kQ == kQ8_0 && V::kDotU8Full;
  constexpr int32_t kOffset = kQ == kQ4_0 ? 8 : kQ8Unsigned ? 128 : 0;
  I dot[MT];
  [[maybe_unused]] typename V::B s16[MT];  // kI16Sums: a Q4 block's 8 pair sums, |sum| <= 8 * 2 * 15 * 127 < 2^15
  #pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) dot[i] = kOffset ? V::set1_i(-kOffset * xi[i * nb + b]) : V::zero_i();
  #pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const B v = V::load_b(q + 64 * c);
    if constexpr (kQ == kQ8_0) {
      const B u = kQ8Unsigned ? V::xor80_b(v) : v;
      #pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        const B xb = V::bcast4_b(xq + i * k + 32 * b + 4 * c);
        dot[i] = kQ8Unsigned ? V::dot_u8s8(dot[i], u, xb) : V::dot_s8s8(dot[i], u, xb);
        V::hold(dot[i]);
      }
    } else if constexpr (V::kI16Sums) {
      const B lo = V::u4_lo_b(v), hi = V::u4_hi_b(v);
      #pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        const int8_t* xp = xq + i * k + 32 * b + 4 * c;
        const B t = V::add_i16(V::madd_i16(lo, V::bcast4_b(xp)), V::madd_i16(hi, V::bcast4_b(xp + 16)));
        s16[i] = c == 0 ? t : V::add_i16(s16[i], t);
        V::hold(s16[i]);
      }
    } else {
      const B lo = V::u4_lo_b(v), hi = V::u4_hi_b(v);
      #pragma GCC unroll 16
      for (int i = 0; i < MT; ++i) {
        const int8_t* xp = xq + i * k + 32 * b + 4 * c;
        dot[i] = V::dot_u8s8(dot[i], lo, V::bcast4_b(xp));
        dot[i] = V::dot_u8s8(dot[i], hi, V::bcast4_b(xp + 16));
      }
    }
  }
  if constexpr (kQ != kQ8_0 && V::kI16Sums) {
    #pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) dot[i] = V::widen_add_i16(dot[i], s16[i]);
  }
  const F dw = V::load_fp16(d);
  #pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) acc[i] = V::fma(V::to_f32(dot[i]), V::mul(dw, V::set1(xd[i * nb + b])), acc[i]);
  if constexpr (kQ == kQ4_1) {
    const F mw = V::load_fp16(m);
    #pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) acc[i] = V::fma(mw, V::set1(xs[i * nb + b]), acc[i]);
  }
}

template <class V, int kQ, int MT>
ENGINE_VEC_FN void packed_tile_t(const uint8_t* g, const PackedX& x, int64_t x0, float* out) {
  using F = typename V::F;
  constexpr int W = V::W, H = kPackRows / W, QB = gguf_packed_quant_bytes(kQ), PB = gguf_packed_pair_bytes(kQ);
  const int64_t k = x.k, nb = k / 32;
  const int8_t* xq = x.q + x0 * k;
  const float* xd = x.d + x0 * nb;
  const float* xs = x.s + x0 * nb;
  const int32_t* xi = x.isum + x0 * nb;
  #pragma GCC unroll 1
  for (int h = 0; h < H; ++h) {
    F acc[MT];
    #pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) acc[i] = V::zero();
    const uint8_t* p = g + 4 * W * h;                                        // quants of a pair's first block
    const uint16_t* s = reinterpret_cast<const uint16_t*>(g + 2 * QB) + W * h;  // its scales
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, p += PB, s += PB / 2) {
      #pragma GCC unroll 16
      for (int o = 0; o < PB; o += 64) __builtin_prefetch(p + kPackedPrefetchBytes + o);
      packed_block<V, kQ, MT>(acc, p, s, s + 2 * kPackRows, b, xq, k, xd, xs, xi, nb);
      packed_block<V, kQ, MT>(acc, p + QB, s + kPackRows, s + 3 * kPackRows, b + 1, xq, k, xd, xs, xi, nb);
    }
    if (b < nb) packed_block<V, kQ, MT>(acc, p, s, s + 2 * kPackRows, b, xq, k, xd, xs, xi, nb);
    #pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) V::store(out + i * kPackRows + W * h, acc[i]);
  }
}

template <class V, int kQ, int MT>
ENGINE_VEC_FN inline void packed_tile_rows(int mt, const uint8_t* g, const PackedX& x, int64_t x0, float* out) {
  if constexpr (MT > 1) {
    if (mt < MT) return packed_tile_rows<V, kQ, MT - 1>(mt, g, x, x0, out);
  }
  packed_tile_t<V, kQ, MT>(g, x, x0, out);
}

template <class V>
ENGINE_VEC_FN void packed_tile_impl(int qtype, const uint8_t* g, const PackedX& x, int64_t x0, int mt, float* out) {
  with_qtype(qtype, [&](auto q) { packed_tile_rows<V, decltype(q)::value, kPackedTileRows<V>>(mt, g, x, x0, out); });
}

template <class V>
GgufPackedKernels packed_kernels() {
  static_assert(kPackedTileRows<V> <= kPackedMaxTileRows, "the driver's tile buffer holds kPackedMaxTileRows rows");
  return {kPackedTileRows<V>, q8_quantize<V, 1>, packed_tile_impl<V>};
}

}  // namespace
}  // namespace engine_cpu
