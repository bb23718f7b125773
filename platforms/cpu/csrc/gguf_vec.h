// The vector layer's GGUF block members, per backend of vec.h (kept here, next to their only users, so
// the GGUF kernels and the small-op kernels that share vec.h can change independently). For a backend V,
// QuantOps<V> has, with W = V::W fp32 lanes:
//   from_i8(p)   W signed bytes at p as W floats (Q8_0 quants);
//   from_u4lo(p) the low nibbles of the W bytes at p as W floats (0..15), from_u4hi(p) the high nibbles;
//   from_u8(p)   the W bytes at p, unsigned, as W floats (0..255: low + 16 * high nibble);
//   reduce4(v, out) out[j] = the sum of the lanes of v[j] for j < 4;
//   kBlockLoads: whether q4_block / q8_block exist (where widening a whole block from 16-byte loads beats
//                32 / W loads of W bytes): q4_block(qs, q, whole) = a Q4 block's 16 quant bytes as 32 / W vectors,
//                the low nibbles (elements 0..15) then the high nibbles, or with `whole` the whole bytes;
//                q8_block(p, q) = the 32 signed bytes of a Q8_0 block;
//   kLut16: whether lut16_lo(t, p) / lut16_hi(t, p) exist and are cheap: lane l = lane (p[l] & 15) /
//   (p[l] >> 4) of the 16-lane table t (W == 16 only: one permute replaces the int -> float conversion, so
//   a Q4 block's 16 possible values are computed once per block and each nibble picks its own).
// A Q4 block's 32 quants are the low nibbles of its 16 bytes (elements 0..15) then the high nibbles
// (16..31), so a block is from_u4lo(qs + W * c) for c < 16 / W, then from_u4hi likewise.
// Q8Ops<V> (the Q8-activation tile, gguf_q8act_impl.h): Wt load_w<kQ>(qs) prepares a weight block's quants,
// F dot<kQ>(wt, xq) is its integer dot with 32 int8 activations as W fp32 lanes whose sum is the exact block
// dot (lane partial sums of int8 products, converted once). Backends: scalar, AVX2 (vpmaddubsw + vpmaddwd:
// no 16-bit sum saturates, Q4 weights are 0..15 and Q8_0 multiplies |w| <= 128 by x carrying w's sign),
// NEON (widening multiply-accumulates; the dotprod variant is in gguf_q8act_neon_dotprod.cpp), VSX
// (vmsummbm). AVX-512 VNNI keeps its own two-blocks-per-vector kernel (gguf_q8act_avx512.cpp).
// Include only inside the matching #ifdef, like vec.h; every function is static inline with the
// backend's target attribute (internal linkage).
#pragma once

#include <cstring>

#include "gguf_dequant.h"
#include "vec.h"

namespace engine_cpu {
namespace {

template <class V>
struct QuantOps;

template <class V>
struct Q8Ops;

template <>
struct Q8Ops<VecScalar> {
  using F = VecScalar::F;
  struct Wt {
    int v[32];
  };
  template <int kQ>
  static Wt load_w(const uint8_t* qs) {
    Wt w;
    for (int j = 0; j < 16; ++j) {
      if (kQ == kQ8_0) {
        w.v[j] = static_cast<int8_t>(qs[j]);
        w.v[j + 16] = static_cast<int8_t>(qs[j + 16]);
      } else {
        w.v[j] = qs[j] & 15;
        w.v[j + 16] = qs[j] >> 4;
      }
    }
    return w;
  }
  template <int kQ>
  static F dot(const Wt& w, const int8_t* xq) {
    int s[4] = {0, 0, 0, 0};
    for (int j = 0; j < 32; ++j) s[j % 4] += w.v[j] * xq[j];
    return F{{float(s[0]), float(s[1]), float(s[2]), float(s[3])}};
  }
};

template <>
struct QuantOps<VecScalar> {
  using F = VecScalar::F;
  static F from_i8(const int8_t* p) { return F{{float(p[0]), float(p[1]), float(p[2]), float(p[3])}}; }
  static F from_u4lo(const uint8_t* p) {
    return F{{float(p[0] & 15), float(p[1] & 15), float(p[2] & 15), float(p[3] & 15)}};
  }
  static F from_u4hi(const uint8_t* p) {
    return F{{float(p[0] >> 4), float(p[1] >> 4), float(p[2] >> 4), float(p[3] >> 4)}};
  }
  static F from_u8(const uint8_t* p) { return F{{float(p[0]), float(p[1]), float(p[2]), float(p[3])}}; }
  static void reduce4(const F* v, float* out) { VecScalar::store(out, VecScalar::transpose_add(v)); }
  static constexpr bool kLut16 = false;
  static constexpr bool kBlockLoads = false;
};

#ifdef ENGINE_X86
template <>
struct QuantOps<VecAvx2> {
  using F = __m256;
  ENGINE_AVX2 static __m256i bytes(const void* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  ENGINE_AVX2 static F from_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  ENGINE_AVX2 static F from_u4lo(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(bytes(p), _mm256_set1_epi32(0x0f)));
  }
  ENGINE_AVX2 static F from_u4hi(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes(p), 4)); }
  ENGINE_AVX2 static F from_u8(const uint8_t* p) { return _mm256_cvtepi32_ps(bytes(p)); }
  ENGINE_AVX2 static void reduce4(const F* v, float* out) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
  }
  static constexpr bool kLut16 = false;  // a 16-entry table is two ymm registers: 2 permutes + a blend
  static constexpr bool kBlockLoads = false;
};

template <>
struct Q8Ops<VecAvx2> {
  using F = __m256;
  struct Wt {
    __m256i w, raw;  // unsigned weights (Q8_0: |w|), and Q8_0's signed bytes
  };
  template <int kQ>
  ENGINE_AVX2 static Wt load_w(const uint8_t* qs) {
    if (kQ == kQ8_0) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      return {_mm256_abs_epi8(raw), raw};
    }
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return {_mm256_and_si256(w, _mm256_set1_epi8(0x0f)), _mm256_setzero_si256()};
  }
  template <int kQ>
  ENGINE_AVX2 static F dot(const Wt& w, const int8_t* xq) {
    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    if (kQ == kQ8_0) xv = _mm256_sign_epi8(xv, w.raw);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w.w, xv), _mm256_set1_epi16(1)));
  }
};

template <>
struct QuantOps<VecAvx512> {
  using F = __m512;
  ENGINE_AVX512 static __m512i bytes(const void* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ENGINE_AVX512 static F from_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  ENGINE_AVX512 static F from_u4lo(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(bytes(p), _mm512_set1_epi32(0x0f)));
  }
  ENGINE_AVX512 static F from_u4hi(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes(p), 4)); }
  ENGINE_AVX512 static F from_u8(const uint8_t* p) { return _mm512_cvtepi32_ps(bytes(p)); }
  ENGINE_AVX512 static void reduce4(const F* v, float* out) { _mm_storeu_ps(out, hsum4(v[0], v[1], v[2], v[3])); }
  static constexpr bool kLut16 = true;  // vpermps reads the low 4 bits of each index lane
  static constexpr bool kBlockLoads = false;
  ENGINE_AVX512 static F lut16_lo(F t, const uint8_t* p) { return _mm512_permutexvar_ps(bytes(p), t); }
  ENGINE_AVX512 static F lut16_hi(F t, const uint8_t* p) {
    return _mm512_permutexvar_ps(_mm512_srli_epi32(bytes(p), 4), t);
  }
};
#endif  // ENGINE_X86

#ifdef ENGINE_ARM64
// Weights as signed bytes (Q4 nibbles fit); Dot: the int8 block dot (plain: widening multiply-accumulates).
struct Q8NeonWiden {
  static int32x4_t run(int8x16_t wlo, int8x16_t whi, const int8_t* xq) {
    const int8x16_t xlo = vld1q_s8(xq), xhi = vld1q_s8(xq + 16);
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(wlo), vget_low_s8(xlo)));
    acc = vpadalq_s16(acc, vmull_high_s8(wlo, xlo));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(whi), vget_low_s8(xhi)));
    return vpadalq_s16(acc, vmull_high_s8(whi, xhi));
  }
};

template <class Dot>
struct Q8OpsNeon {
  using F = float32x4_t;
  struct Wt {
    int8x16_t lo, hi;
  };
  template <int kQ>
  static Wt load_w(const uint8_t* qs) {
    if (kQ == kQ8_0) return {vld1q_s8(reinterpret_cast<const int8_t*>(qs)), vld1q_s8(reinterpret_cast<const int8_t*>(qs + 16))};
    const uint8x16_t v = vld1q_u8(qs);
    return {vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vreinterpretq_s8_u8(vshrq_n_u8(v, 4))};
  }
  template <int kQ>
  static F dot(const Wt& w, const int8_t* xq) { return vcvtq_f32_s32(Dot::run(w.lo, w.hi, xq)); }
};

template <>
struct Q8Ops<VecNeon> : Q8OpsNeon<Q8NeonWiden> {};

template <>
struct QuantOps<VecNeon> {
  using F = float32x4_t;
  static uint32x4_t bytes(const uint8_t* p) {
    uint32_t t;
    std::memcpy(&t, p, 4);
    return vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(t)))));
  }
  static F from_i8(const int8_t* p) {
    uint32_t t;
    std::memcpy(&t, p, 4);
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(t))))));
  }
  static F from_u4lo(const uint8_t* p) { return vcvtq_f32_u32(vandq_u32(bytes(p), vdupq_n_u32(15))); }
  static F from_u4hi(const uint8_t* p) { return vcvtq_f32_u32(vshrq_n_u32(bytes(p), 4)); }
  static F from_u8(const uint8_t* p) { return vcvtq_f32_u32(bytes(p)); }
  static void reduce4(const F* v, float* out) { vst1q_f32(out, VecNeon::transpose_add(v)); }
  // Whole blocks from 16-byte loads: widening 16 lanes at a time takes half the instructions of 4-byte loads.
  static constexpr bool kBlockLoads = true;
  static void widen_u8(uint8x16_t v, F* q) {  // 16 unsigned bytes -> 4 vectors
    const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    q[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    q[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
    q[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    q[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
  }
  static void widen_s8(int8x16_t v, F* q) {  // 16 signed bytes -> 4 vectors
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    q[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    q[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    q[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    q[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
  }
  static void q4_block(const uint8_t* qs, F* q, bool whole) {
    const uint8x16_t b = vld1q_u8(qs);
    widen_u8(vandq_u8(b, vdupq_n_u8(15)), q);
    widen_u8(whole ? b : vshrq_n_u8(b, 4), q + 4);
  }
  static void q8_block(const int8_t* p, F* q) {
    widen_s8(vld1q_s8(p), q);
    widen_s8(vld1q_s8(p + 16), q + 4);
  }
  static constexpr bool kLut16 = false;
};
#endif  // ENGINE_ARM64

#ifdef ENGINE_VSX
template <>
struct Q8Ops<VecVsx> {
  using F = __vector float;
  using S8 = __vector signed char;
  using U8 = __vector unsigned char;
  struct Wt {
    U8 lo, hi;  // unsigned weights (Q8_0: |w|)
    __vector __bool char neglo, neghi;  // Q8_0: w < 0
  };
  template <int kQ>
  static Wt load_w(const uint8_t* qs) {
    if (kQ == kQ8_0) {
      const S8 a = vec_xl(0, reinterpret_cast<const signed char*>(qs));
      const S8 b = vec_xl(16, reinterpret_cast<const signed char*>(qs));
      const S8 z = vec_splats(static_cast<signed char>(0));
      return {reinterpret_cast<U8>(vec_abs(a)), reinterpret_cast<U8>(vec_abs(b)), vec_cmplt(a, z), vec_cmplt(b, z)};
    }
    const U8 v = vec_xl(0, qs);
    const __vector __bool char none = vec_cmplt(v, v);
    return {vec_and(v, vec_splats(static_cast<unsigned char>(15))), vec_sr(v, vec_splats(static_cast<unsigned char>(4))),
            none, none};
  }
  template <int kQ>
  static F dot(const Wt& w, const int8_t* xq) {
    S8 xlo = vec_xl(0, xq), xhi = vec_xl(16, xq);
    if (kQ == kQ8_0) {  // x carries w's sign (|x| <= 127: negation is exact)
      const S8 z = vec_splats(static_cast<signed char>(0));
      xlo = vec_sel(xlo, vec_sub(z, xlo), w.neglo);
      xhi = vec_sel(xhi, vec_sub(z, xhi), w.neghi);
    }
    __vector signed int acc = vec_msum(xlo, w.lo, vec_splats(0));
    acc = vec_msum(xhi, w.hi, acc);
    return vec_ctf(acc, 0);
  }
};

template <>
struct QuantOps<VecVsx> {
  using F = __vector float;
  using U4 = __vector unsigned int;
  static U4 bytes(const uint8_t* p) { return U4{p[0], p[1], p[2], p[3]}; }
  static F from_i8(const int8_t* p) {
    const __vector signed int s = {p[0], p[1], p[2], p[3]};
    return vec_ctf(s, 0);
  }
  static F from_u4lo(const uint8_t* p) { return vec_ctf(vec_and(bytes(p), vec_splats(15u)), 0); }
  static F from_u4hi(const uint8_t* p) { return vec_ctf(vec_sr(bytes(p), vec_splats(4u)), 0); }
  static F from_u8(const uint8_t* p) { return vec_ctf(bytes(p), 0); }
  static void reduce4(const F* v, float* out) { VecVsx::store(out, VecVsx::transpose_add(v)); }
  static constexpr bool kLut16 = false;
  // Whole blocks from 16-byte loads, widened by merging with zero (unsigned) or unpacking (signed); the
  // merges follow element order, so element 0 is the lowest-addressed byte on either endianness.
  static constexpr bool kBlockLoads = true;
  using U8 = __vector unsigned char;
  using U16 = __vector unsigned short;
  static void widen_u8(U8 v, F* q) {
    const U8 z8 = vec_splats(static_cast<unsigned char>(0));
    const U16 z16 = vec_splats(static_cast<unsigned short>(0));
    const U16 lo = reinterpret_cast<U16>(vec_mergeh(v, z8)), hi = reinterpret_cast<U16>(vec_mergel(v, z8));
    q[0] = vec_ctf(reinterpret_cast<U4>(vec_mergeh(lo, z16)), 0);
    q[1] = vec_ctf(reinterpret_cast<U4>(vec_mergel(lo, z16)), 0);
    q[2] = vec_ctf(reinterpret_cast<U4>(vec_mergeh(hi, z16)), 0);
    q[3] = vec_ctf(reinterpret_cast<U4>(vec_mergel(hi, z16)), 0);
  }
  static void widen_s8(__vector signed char v, F* q) {
    const __vector signed short lo = vec_unpackh(v), hi = vec_unpackl(v);
    q[0] = vec_ctf(vec_unpackh(lo), 0);
    q[1] = vec_ctf(vec_unpackl(lo), 0);
    q[2] = vec_ctf(vec_unpackh(hi), 0);
    q[3] = vec_ctf(vec_unpackl(hi), 0);
  }
  static void q4_block(const uint8_t* qs, F* q, bool whole) {
    const U8 b = vec_xl(0, qs);
    widen_u8(vec_and(b, vec_splats(static_cast<unsigned char>(15))), q);
    widen_u8(whole ? b : vec_sr(b, vec_splats(static_cast<unsigned char>(4))), q + 4);
  }
  static void q8_block(const int8_t* p, F* q) {
    widen_s8(vec_xl(0, p), q);
    widen_s8(vec_xl(16, p), q + 4);
  }
};
#endif  // ENGINE_VSX

}  // namespace
}  // namespace engine_cpu
