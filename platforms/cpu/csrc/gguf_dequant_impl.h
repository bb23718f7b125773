// GGUF block decode written once on the vector layer (vec.h, with the quantized-block members of
// vec_quant.h): the dequantize of gguf_dequant.h, instantiated per ISA by gguf_dequant_{scalar,avx2,avx512,
// neon,vsx}.cpp (which define ENGINE_VEC_FN, the backend's target attribute, first), and the same block
// decode for the fp32-activation linear's weight panels (gguf_linear_impl.h's decode and gemv). RVV has no
// instantiation here: its GGUF block decode is the length-agnostic one of gguf_linear_rvv.cpp, and the
// dequantize runs the portable path there.
//
// Values are the reference's bit for bit: (q - 8) * d, q * d + m as a multiply then an add (never fused),
// q * d, rounded once to the output type (bf16: nearest even).
#pragma once

#include <cstdint>

#include "gguf_dequant.h"
#include "vec.h"
#include "vec_dtype.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including gguf_dequant_impl.h"
#endif

namespace engine_cpu {
namespace {

template <int kQ>
constexpr int kQBytes = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;

// The 32 unscaled quants of the block at b as 32 / W vectors (Q4: 0..15, Q8_0: -128..127). kWhole (Q4):
// the second half is the whole bytes (low + 16 * high nibble, see gemv_rows), one shift fewer per vector.
template <class V, int kQ, bool kWhole = false>
ENGINE_VEC_FN inline void block_quants(const uint8_t* b, typename V::F* q) {
  using Q = V;
  constexpr int W = V::W, NC = 32 / W;
  const uint8_t* qs = b + (kQ == kQ4_1 ? 4 : 2);
  if constexpr (Q::kBlockLoads) {
    if constexpr (kQ == kQ8_0) Q::q8_block(reinterpret_cast<const int8_t*>(qs), q);
    else Q::q4_block(qs, q, kWhole);
  } else if constexpr (kQ == kQ8_0) {
    #pragma GCC unroll 32
    for (int c = 0; c < NC; ++c) q[c] = Q::from_i8(reinterpret_cast<const int8_t*>(qs) + W * c);
  } else {
    // Low nibbles first, then high: GCC emits the dequantize's stores in this order, and stores out of
    // address order (0, 16, 8, 24 on AVX2) made the fp32 dequantize ~25% slower (measured).
    #pragma GCC unroll 32
    for (int c = 0; c < NC / 2; ++c) q[c] = Q::from_u4lo(qs + W * c);
    #pragma GCC unroll 32
    for (int c = 0; c < NC / 2; ++c) q[NC / 2 + c] = kWhole ? Q::from_u8(qs + W * c) : Q::from_u4hi(qs + W * c);
  }
}

// The fp16 scale at p as fp32: looked up in `lut` (fp16_lut()), or with kCvt (backends with kFp16Scalar)
// converted in a register.
template <class V, bool kCvt>
ENGINE_VEC_FN inline float block_scale(const uint8_t* p, const float* lut) {
  if constexpr (kCvt) return V::fp16_scalar(load_fp16(p));
  else return lut[load_fp16(p)];
}

// kLut16 backends (W == 16): the 16 values a Q4 block can hold, as the reference computes them: (i - 8) * d
// or i * d + m (a multiply, then an add; kFused: one FMA, within an ulp, for gemv).
template <class V, int kQ, bool kFused = false, bool kCvt = false>
ENGINE_VEC_FN inline typename V::F q4_table(typename V::F d, const uint8_t* b, const float* lut) {
  alignas(64) static const float kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  alignas(64) static const float kIota8[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  if constexpr (kQ == kQ4_0) return V::mul(V::load(kIota8), d);
  else if constexpr (kFused) return V::fma(V::load(kIota), d, V::set1(block_scale<V, kCvt>(b + 2, lut)));
  else return V::add(V::mul(V::load(kIota), d), V::set1(block_scale<V, kCvt>(b + 2, lut)));
}

// rows x cols (a multiple of 32) values: row r's blocks at src + r * src_stride (bytes), its values to
// dst + r * dst_stride (elements) as fp32 or (D = BF16) bf16. `lut` maps fp16 bits to fp32 (fp16_lut());
// kCvt: convert the scales in registers instead (block_scale).
template <class V, int kQ, DType D, bool kCvt = false>
ENGINE_VEC_FN void dequant_rows(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, void* dst,
                                int64_t dst_stride, const float* lut) {
  using F = typename V::F;
  constexpr int W = V::W, NC = 32 / W;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* b = src + r * src_stride;
    int64_t o = r * dst_stride;
    for (int64_t c = 0; c < cols; c += 32, b += kQBytes<kQ>, o += 32) {
      const F d = V::set1(block_scale<V, kCvt>(b, lut));
      if constexpr (kQ != kQ8_0 && V::kLut16) {  // the block's 16 values, each nibble picks one
        const F table = q4_table<V, kQ, false, kCvt>(d, b, lut);
        const uint8_t* qs = b + (kQ == kQ4_1 ? 4 : 2);
        vst<V, D, true>(dst, o, V::lut16_lo(table, qs), 0);
        vst<V, D, true>(dst, o + 16, V::lut16_hi(table, qs), 0);
        continue;
      }
      F q[NC];
      block_quants<V, kQ>(b, q);
      if constexpr (kQ == kQ4_1) {
        const F m = V::set1(block_scale<V, kCvt>(b + 2, lut));
        #pragma GCC unroll 32
        for (int i = 0; i < NC; ++i) vst<V, D, true>(dst, o + W * i, V::add(V::mul(q[i], d), m), 0);
      } else if constexpr (kQ == kQ4_0) {
        const F eight = V::set1(8.0f);
        #pragma GCC unroll 32
        for (int i = 0; i < NC; ++i) vst<V, D, true>(dst, o + W * i, V::mul(V::sub(q[i], eight), d), 0);
      } else {
        #pragma GCC unroll 32
        for (int i = 0; i < NC; ++i) vst<V, D, true>(dst, o + W * i, V::mul(q[i], d), 0);
      }
    }
  }
}

// gguf_dequant on backend V (arguments validated by the dispatcher). The fp32 output streams through L1 and
// evicts the scale table, so there the scales are converted in registers where the backend can: the two
// lookups a Q4_1 block made the AVX-512 fp32 dequantize ~12% slower (measured); with bf16 output (more work
// per value, half the bytes) the lookup, one load, was the faster (benchmarks/csrc/bench_dequant_ab.cpp).
template <class V>
ENGINE_VEC_FN void dequant_impl(const DequantArgs& a, const float* lut) {
  with_qtype(a.qtype, [&](auto q) {
    constexpr int kQ = decltype(q)::value;
    if (a.dtype == DType::BF16)
      dequant_rows<V, kQ, DType::BF16>(a.src, a.src_stride, a.rows, a.cols, a.dst, a.dst_stride, lut);
    else
      dequant_rows<V, kQ, DType::F32, V::kFp16Scalar>(a.src, a.src_stride, a.rows, a.cols, a.dst, a.dst_stride, lut);
  });
}

}  // namespace
}  // namespace engine_cpu
