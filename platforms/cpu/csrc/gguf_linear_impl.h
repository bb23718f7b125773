// The fp32-activation GGUF linear kernels (gguf_linear.h's decode / dot / gemv), written once on the
// vector layer (vec.h, with the quantized-block members of vec_quant.h) and instantiated per ISA by
// gguf_linear_{scalar,avx2,avx512,neon,vsx}.cpp, which define ENGINE_VEC_FN (the backend's target attribute)
// first. RVV keeps its length-agnostic kernels (gguf_linear_rvv.cpp): its vector types are sizeless, so they
// cannot live in arrays as here.
//
// Values: decode gives the reference's values bit for bit ((q - 8) * d, q * d + m as a multiply then an
// add, q * d); gemv computes d * (q . x_b) + m * sum(x_b) per block b (Q4_0: m = -8 d), which is the
// same sum up to the order of the fp32 operations (backends with a 16-lane table lookup, kLut16, take
// each Q4 value from the block's table of its 16 possible values instead).
// The block decode (block_quants, q4_table, dequant_rows) is gguf_dequant_impl.h's, shared with gguf_dequant.
//
// `#pragma GCC unroll` (GCC and clang) sits on every loop over an array of vectors: fully unrolled, the
// arrays live in registers (left rolled, GCC keeps them on the stack: 2x slower at -O2, measured).
#include <cstdint>
#include <vector>

#include "gguf_dequant_impl.h"
#include "gguf_kquant_impl.h"
#include "gguf_linear.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including gguf_linear_impl.h"
#endif

namespace engine_cpu {
namespace {

template <class V>
ENGINE_VEC_FN void decode_impl(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst,
                               const float* lut) {
  with_qtype(qtype, [&](auto q) {
    dequant_rows<V, decltype(q)::value, DType::F32>(w, w_stride, rows, k, dst, k, lut);  // gguf_dequant_impl.h
  });
}

// Registers a dot tile may use: every backend has twice kAccRegs vector registers; 5 hold the four panel
// vectors and an x vector.
template <class V>
constexpr int kDotRows = (2 * V::kAccRegs - 5) / 4 < kMaxTileM ? (2 * V::kAccRegs - 5) / 4 : kMaxTileM;

// MT rows of x against the 4-row panel; U independent accumulator sets hide the FMA latency when MT is small.
template <class V, int MT, int U>
ENGINE_VEC_FN void dot_t(const float* x, int64_t xs, const float* w, int64_t k, float* out) {
  static_assert(kPanelRows == 4, "the accumulator layout assumes 4 panel rows");
  using F = typename V::F;
  constexpr int W = V::W;
  F acc[U][MT][4];
  #pragma GCC unroll 32
  for (int u = 0; u < U; ++u)
    #pragma GCC unroll 32
    for (int i = 0; i < MT; ++i)
      #pragma GCC unroll 32
      for (int j = 0; j < 4; ++j) acc[u][i][j] = V::zero();
  int64_t c = 0;
  for (; c + W * U <= k; c += W * U) {
    #pragma GCC unroll 32
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + W * u;
      const F w0 = V::load(w + cc), w1 = V::load(w + k + cc);
      const F w2 = V::load(w + 2 * k + cc), w3 = V::load(w + 3 * k + cc);
      #pragma GCC unroll 32
      for (int i = 0; i < MT; ++i) {
        const F xv = V::load(x + i * xs + cc);
        acc[u][i][0] = V::fma(w0, xv, acc[u][i][0]);
        acc[u][i][1] = V::fma(w1, xv, acc[u][i][1]);
        acc[u][i][2] = V::fma(w2, xv, acc[u][i][2]);
        acc[u][i][3] = V::fma(w3, xv, acc[u][i][3]);
      }
    }
  }
  for (; c < k; c += W) {  // k % (W * U) (k is a multiple of 32, so of W)
    const F w0 = V::load(w + c), w1 = V::load(w + k + c);
    const F w2 = V::load(w + 2 * k + c), w3 = V::load(w + 3 * k + c);
    #pragma GCC unroll 32
    for (int i = 0; i < MT; ++i) {
      const F xv = V::load(x + i * xs + c);
      acc[0][i][0] = V::fma(w0, xv, acc[0][i][0]);
      acc[0][i][1] = V::fma(w1, xv, acc[0][i][1]);
      acc[0][i][2] = V::fma(w2, xv, acc[0][i][2]);
      acc[0][i][3] = V::fma(w3, xv, acc[0][i][3]);
    }
  }
  #pragma GCC unroll 32
  for (int i = 0; i < MT; ++i) {
    #pragma GCC unroll 32
    for (int u = 1; u < U; ++u)
      #pragma GCC unroll 32
      for (int j = 0; j < 4; ++j) acc[0][i][j] = V::add(acc[0][i][j], acc[u][i][j]);
    V::store_sum4(out + i * 4, acc[0][i]);
  }
}

template <class V, int MT>
ENGINE_VEC_FN inline void dot_rows(const float* x, int64_t xs, const float* w, int64_t k, float* out) {
  constexpr int U = MT <= 2 && 8 * MT + 5 <= 2 * V::kAccRegs ? 2 : 1;
  dot_t<V, MT, U>(x, xs, w, k, out);
}

template <class V, int MT>
ENGINE_VEC_FN inline void dot_tail(int mt, const float* x, int64_t xs, const float* w, int64_t k, float* out) {
  if constexpr (MT > 0) {
    if (mt == MT) return dot_rows<V, MT>(x, xs, w, k, out);
    dot_tail<V, MT - 1>(mt, x, xs, w, k, out);
  }
}

template <class V>
ENGINE_VEC_FN void dot_impl(const float* x, int64_t xs, int mt, const float* w, int64_t k, float* out) {
  constexpr int R = kDotRows<V>;
  int i = 0;
  for (; i + R <= mt; i += R) dot_rows<V, R>(x + i * xs, xs, w, k, out + i * 4);
  dot_tail<V, R - 1>(mt - i, x + i * xs, xs, w, k, out + i * 4);
}

// M = 1: R weight rows at once, each block decoded in registers. Per block b of a row the dot product is
// d * (q . x_b) + m * sum(x_b), so the quants are converted but never scaled; xsum[b * W + l] holds the
// W-lane partial sums of x_b (computed once per call). Q4 without kLut16: with lo_j, hi_j the nibbles of
// byte j (elements j and j + 16) and a_j = lo_j + 16 hi_j the byte itself,
//   q . x_b = sum_j lo_j x_j + hi_j x_{j+16} = sum_j lo_j (x_j - x_{j+16} / 16) + a_j (x_{j+16} / 16),
// so x arrives as xq (that pair of vectors per block, split_x) and the high nibbles need no shift.
template <class V, int kQ, int R>
ENGINE_VEC_FN void gemv_rows(const uint8_t* w, int64_t w_stride, int64_t k, const float* x, const float* xsum,
                             float* out, const float* lut) {
  using F = typename V::F;
  constexpr int W = V::W, NC = 32 / W;
  F acc[R], accm[R];
  #pragma GCC unroll 32
  for (int i = 0; i < R; ++i) acc[i] = accm[i] = V::zero();
  for (int64_t c = 0, off = 0; c < k; c += 32, off += kQBytes<kQ>) {
    F xv[NC];
    #pragma GCC unroll 32
    for (int j = 0; j < NC; ++j) xv[j] = V::load(x + c + W * j);
    const F xs = kQ != kQ8_0 && !V::kLut16 ? V::load(xsum + c / 32 * W) : V::zero();
    // Q4_0: d * (q . x_b - 8 sum(x_b)), the -8 sum(x_b) seeding each row's block dot (no scalar m per row).
    const F xs8 = kQ == kQ4_0 ? V::mul(xs, V::set1(-8.0f)) : V::zero();
    #pragma GCC unroll 32
    for (int i = 0; i < R; ++i) {
      const uint8_t* b = w + i * w_stride + off;
      // The next R rows (prefetch never faults, past the end too): several times the bandwidth of the
      // hardware prefetcher alone on the 30 MB LM head, measured.
      __builtin_prefetch(b + R * w_stride, 0, 3);
      if constexpr (kQ != kQ8_0 && V::kLut16) {  // values from the block's table: no scaling after
        const F table = q4_table<V, kQ, true>(V::set1(lut[load_fp16(b)]), b, lut);
        const uint8_t* qs = b + (kQ == kQ4_1 ? 4 : 2);
        acc[i] = V::fma(V::lut16_lo(table, qs), xv[0], acc[i]);
        accm[i] = V::fma(V::lut16_hi(table, qs), xv[1], accm[i]);
        continue;
      }
      F q[NC];
      block_quants<V, kQ, kQ != kQ8_0>(b, q);
      F t = kQ == kQ4_0 ? V::fma(q[0], xv[0], xs8) : V::mul(q[0], xv[0]);
      #pragma GCC unroll 32
      for (int j = 1; j < NC; ++j) t = V::fma(q[j], xv[j], t);
      acc[i] = V::fma(t, V::set1(lut[load_fp16(b)]), acc[i]);
      if constexpr (kQ == kQ4_1) accm[i] = V::fma(xs, V::set1(lut[load_fp16(b + 2)]), accm[i]);
    }
  }
  if constexpr (R == 4) {
    F s[4];
    #pragma GCC unroll 32
    for (int i = 0; i < 4; ++i) s[i] = V::add(acc[i], accm[i]);
    V::store_sum4(out, s);
  } else {
    #pragma GCC unroll 32
    for (int i = 0; i < R; ++i) out[i] = V::reduce_add(V::add(acc[i], accm[i]));
  }
}

// xsum[b * W + l] = sum over the block's chunks j of x[32 b + W j + l].
template <class V>
ENGINE_VEC_FN void block_sums(const float* x, int64_t k, float* xsum) {
  constexpr int W = V::W;
  for (int64_t c = 0; c < k; c += 32) {
    typename V::F s = V::load(x + c);
    #pragma GCC unroll 32
    for (int j = 1; j < 32 / W; ++j) s = V::add(s, V::load(x + c + W * j));
    V::store(xsum + c / 32 * W, s);
  }
}

// xq per block: x_j - x_{j+16} / 16 for j < 16, then x_{j+16} / 16 (gemv_rows).
template <class V>
ENGINE_VEC_FN void split_x(const float* x, int64_t k, float* xq) {
  constexpr int W = V::W;
  const typename V::F sixteenth = V::set1(0.0625f);
  for (int64_t c = 0; c < k; c += 32) {
    #pragma GCC unroll 32
    for (int j = 0; j < 16; j += W) {
      const typename V::F v = V::mul(V::load(x + c + 16 + j), sixteenth);
      V::store(xq + c + j, V::sub(V::load(x + c + j), v));
      V::store(xq + c + 16 + j, v);
    }
  }
}

template <class V, int kQ>
ENGINE_VEC_FN void gemv_q(const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out,
                          const float* lut) {
  thread_local std::vector<float> xsum, xq;
  if (kQ != kQ8_0 && !V::kLut16) {
    if (xsum.size() < static_cast<size_t>(k / 32 * V::W)) xsum.resize(static_cast<size_t>(k / 32 * V::W));
    if (xq.size() < static_cast<size_t>(k + 16)) xq.resize(static_cast<size_t>(k + 16));
    float* const xa = xq.data() + (16 - reinterpret_cast<uintptr_t>(xq.data()) / 4 % 16) % 16;  // 64-byte aligned
    block_sums<V>(x, k, xsum.data());
    split_x<V>(x, k, xa);
    x = xa;
  }
  int r = 0;
  for (; r + 4 <= rows; r += 4) gemv_rows<V, kQ, 4>(w + r * w_stride, w_stride, k, x, xsum.data(), out + r, lut);
  for (; r < rows; ++r) gemv_rows<V, kQ, 1>(w + r * w_stride, w_stride, k, x, xsum.data(), out + r, lut);
}

template <class V>
ENGINE_VEC_FN void gemv_impl(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x,
                             float* out, const float* lut) {
  with_qtype(qtype, [&](auto q) { gemv_q<V, decltype(q)::value>(w, w_stride, rows, k, x, out, lut); });
}

// The K-quant row dots on the vector layer (kquant_gemv_v): per sub-block, W lanes of quants widened in place
// (nibbles, plus Q5_K's fifth bit or Q6_K's two high bits, from_bits) and FMA'd with x into that sub-block's sum,
// which is scaled once; Q4_K / Q5_K's minimums come off as c_j * sum(x_j), Q6_K's -32 as 32 * sum(x_run). At M = 1
// against Q4_0's packed kernel (bench_cpu_kquant.py, 2-core Emerald Rapids, AVX-512): Q4_K 0.22-0.24x -> 0.40-0.58x,
// Q5_K 0.14 -> 0.29-0.40x, Q6_K 0.09 -> 0.21-0.28x (BENCHMARKS.md, session 19).

// Sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles) of a Q4_K / Q5_K super-block, each summed with x.
template <class V, bool kFive, int G>
ENGINE_VEC_FN inline void q45k_group(const uint8_t* b, const float* x0, typename V::F& lo, typename V::F& hi) {
  const uint8_t* q = b + (kFive ? 48 : 16) + 32 * G;
  #pragma GCC unroll 8
  for (int i = 0; i < 32; i += V::W) {
    typename V::F l = V::from_u4lo(q + i), h = V::from_u4hi(q + i);
    if constexpr (kFive) {  // the fifth bit of element i of sub-blocks 2G and 2G + 1: bits 2G and 2G + 1 of qh[i]
      l = V::fma(V::template from_bits<2 * G, 1>(b + 16 + i), V::set1(16.0f), l);
      h = V::fma(V::template from_bits<2 * G + 1, 1>(b + 16 + i), V::set1(16.0f), h);
    }
    lo = V::fma(l, V::load(x0 + i), lo);
    hi = V::fma(h, V::load(x0 + 32 + i), hi);
  }
}

template <class V, bool kFive>
ENGINE_VEC_FN inline float q45k_row_dot(const uint8_t* b, int64_t k, const float* x, const float* xsum) {
  using F = typename V::F;
  F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  float off = 0.0f;
  for (int64_t c0 = 0; c0 < k; c0 += 256, b += kFive ? 176 : 144) {
    float a[8], c[8];
    scale_min_k4(b + 4, fp16_to_f32(load_fp16(b)), fp16_to_f32(load_fp16(b + 2)), a, c);
    F lo[4] = {V::zero(), V::zero(), V::zero(), V::zero()}, hi[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
    q45k_group<V, kFive, 0>(b, x + c0, lo[0], hi[0]);
    q45k_group<V, kFive, 1>(b, x + c0 + 64, lo[1], hi[1]);
    q45k_group<V, kFive, 2>(b, x + c0 + 128, lo[2], hi[2]);
    q45k_group<V, kFive, 3>(b, x + c0 + 192, lo[3], hi[3]);
    #pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      acc[g] = V::fma(lo[g], V::set1(a[2 * g]), acc[g]);
      acc[g] = V::fma(hi[g], V::set1(a[2 * g + 1]), acc[g]);
      off += c[2 * g] * xsum[c0 / 32 + 2 * g] + c[2 * g + 1] * xsum[c0 / 32 + 2 * g + 1];
    }
  }
  return V::reduce_add(V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3]))) - off;
}

// Group S (elements 32S + i, i < 32) of a Q6_K half: a nibble of ql[32 (S % 2) + i] (low for S < 2), bits 2S, 2S + 1
// of qh[i]; scales per 16 elements (sc[2S] for i < 16, sc[2S + 1] above).
template <class V, int S>
ENGINE_VEC_FN inline typename V::F q6k_group(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, float d,
                                            const float* xs, typename V::F acc) {
  using F = typename V::F;
  #pragma GCC unroll 2
  for (int t = 0; t < 2; ++t) {
    F run = V::zero(), xrun = V::zero();
    #pragma GCC unroll 4
    for (int i = 16 * t; i < 16 * t + 16; i += V::W) {
      F lo;
      if constexpr (S < 2) lo = V::from_u4lo(ql + 32 * (S % 2) + i);
      else lo = V::from_u4hi(ql + 32 * (S % 2) + i);
      const F q = V::fma(V::template from_bits<2 * S, 3>(qh + i), V::set1(16.0f), lo);
      const F xv = V::load(xs + 32 * S + i);
      run = V::fma(q, xv, run);
      xrun = V::add(xrun, xv);
    }
    acc = V::fma(V::fma(xrun, V::set1(-32.0f), run), V::set1(d * static_cast<float>(sc[2 * S + t])), acc);
  }
  return acc;
}

template <class V>
ENGINE_VEC_FN inline float q6k_row_dot(const uint8_t* b, int64_t k, const float* x) {
  using F = typename V::F;
  F acc[2] = {V::zero(), V::zero()};
  for (int64_t c0 = 0; c0 < k; c0 += 256, b += 210) {
    const float d = fp16_to_f32(load_fp16(b + 208));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
      const float* xs = x + c0 + 128 * h;
      acc[h] = q6k_group<V, 0>(ql, qh, sc, d, xs, acc[h]);
      acc[h] = q6k_group<V, 1>(ql, qh, sc, d, xs, acc[h]);
      acc[h] = q6k_group<V, 2>(ql, qh, sc, d, xs, acc[h]);
      acc[h] = q6k_group<V, 3>(ql, qh, sc, d, xs, acc[h]);
    }
  }
  return V::reduce_add(V::add(acc[0], acc[1]));
}

template <class V>
ENGINE_VEC_FN void kquant_gemv_v(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x,
                                 const float* xsum, float* out) {
  for (int r = 0; r < rows; ++r) {
    const uint8_t* b = w + r * w_stride;
    out[r] = qtype == kQ4_K ? q45k_row_dot<V, false>(b, k, x, xsum)
             : qtype == kQ5_K ? q45k_row_dot<V, true>(b, k, x, xsum) : q6k_row_dot<V>(b, k, x);
  }
}

template <class V>
GgufLinearKernels gguf_kernels() {
  return {decode_impl<V>, dot_impl<V>, gemv_impl<V>, kquant_decode_rows, kquant_gemv_v<V>};
}

}  // namespace
}  // namespace engine_cpu
