// The one-source vector layer: a kernel is written once against a backend `V` and instantiated per
// target (scalar, AVX2, AVX-512, NEON, VSX, RVV) by a small per-ISA file that includes the kernel's
// `*_impl.h` with that backend; RVV kernels use the length-agnostic loop shape described below.
//
// Why our own layer and not Google Highway (tried 2026-11-30 with the Debian 12 toolchains, FACTS.md):
// Debian's only Highway (libhwy-dev 1.0.3) does not compile RVV with clang-19 (pre-`__riscv_` intrinsic
// names), picks its SCALAR target for ppc64le -mcpu=power9 and SSSE3 (not AVX2) for x86-64-v3 in static
// mode, and fails on aarch64 with gcc-12; there is no newer Highway in the package sources (libhwy-dev
// is Multi-Arch: same, so arm64/ppc64el/riscv64 copies install, but they are the same 1.0.3, and its
// runtime dispatch links libhwy.so.1, one more shared library in every wheel), so it would have to be
// vendored from a newer release into every build. This header is ~300 lines, compiles with every
// toolchain CI uses (gcc-12 for x86/aarch64/ppc64le, clang-19 for riscv64), adds nothing to a wheel,
// and a kernel written on it compiles to the loops of the hand-written x86 kernel it replaced: paged
// attention measured 0.91-1.03x the old AVX2/AVX-512 tiles at 512-2048 token contexts, 1.1-1.18x
// (+0.7-0.9 us) on a 100-token call (BENCHMARKS.md, 2026-12-01).
//
// Two shapes of use:
// * Fixed width (x86, NEON, VSX, scalar): `typename V::F` is a plain vector type with `V::W` fp32
//   lanes, so kernels may keep arrays of vectors in registers (attention keeps the query row and the
//   output accumulators there). Every function carries the backend's target attribute (ENGINE_VEC_FN
//   in the kernel file), so x86 code is compiled per function and picked at run time (isa.cpp).
// * Length agnostic (RVV 1.0, and any backend): loops are written
//     for (size_t i = 0, vl; i < n; i += vl) { vl = setvl(n - i); ... }
//   with no arrays of vectors (RVV types are sizeless), and the vector length is read at run time, so
//   one binary is correct at any VLEN. The RVV kernels (gguf_linear_rvv.cpp) are written that way, and
//   the streaming members below give every backend (VecRvv of vec_rvv.h included) that shape with
//   lanes() as the step: rms_norm_impl.h, rotary_impl.h and activation_impl.h use it.
//
// Integers and quantized blocks (int8 dot products, nibble and byte widening, the Q8 block loads): the members
// of the same backends, written in vec_quant.h (each backend here derives from its base there; VecAvx512Vnni
// and VecNeonDot add the integer dot of the optional extensions), so kernels see one abstraction, `V::`.
//
// Each backend is a struct of static inline functions in an anonymous namespace (internal linkage: no
// ISA-specific code can leak into a shared inline definition). Include only inside the matching
// #ifdef (ENGINE_X86, ENGINE_ARM64, ENGINE_VSX); the RVV backends (vec_rvv.h) come with -march=...v.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "convert.h"
#include "isa.h"

#ifdef ENGINE_X86
#include "activation_exp_x86.h"
#include "simd_x86.h"
#endif
#ifdef ENGINE_ARM64
#include <arm_neon.h>
#endif
#ifdef ENGINE_VSX
#include <altivec.h>
#undef vector
#undef pixel
#undef bool
#endif

#include "vec_quant.h"  // the integer and quantized-block members: the bases of the backends below

namespace engine_cpu {
namespace {

// memcpy of bytes <= kMax (a power of two) as a few fixed-size moves (a variable-size memcpy is a
// library call): the partial vectors of the *_n loads and stores.
template <size_t kMax>
inline void copy_small(void* dst, const void* src, size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  size_t o = 0;
  if (bytes == kMax) return (void)std::memcpy(d, s, kMax);
  if (bytes & 8) std::memcpy(d + o, s + o, 8), o += 8;
  if (bytes & 4) std::memcpy(d + o, s + o, 4), o += 4;
  if (bytes & 2) std::memcpy(d + o, s + o, 2), o += 2;
  if (bytes & 1) d[o] = s[o];
}

// The fixed-width contract, shown by the portable backend: every other backend has the same members.
// `fma(a, b, c)` = a * b + c; `transpose_add(v)` takes W vectors and returns the vector whose lane i is
// the sum of the lanes of v[i]; `store_sum4(out, v)` writes out[j] = the sum of the lanes of v[j], j < 4;
// abs and max are lanewise; `keep_first(v, n, fill)` keeps lanes < n and puts fill in the others;
// kAccRegs / kMaxRows size register blocking (accumulators a kernel may keep live).
// Streaming members (elementwise kernels: rms_norm, rotary, activation; every backend, RVV included):
// lanes() = lanes per step (W, or VLMAX read at run time on RVV); `*_n(p, n)` loads put 0 in lanes >= n
// and `*_n` stores write lanes < n only (n <= lanes()); store_fp16 rounds to nearest even;
// swap_pairs exchanges lanes 2i and 2i+1; dup_pairs(p) has lanes 2i and 2i+1 = p[i] (reads lanes()/2
// floats; dup_pairs_n reads n/2, n even); neg_even flips the sign of the even lanes. The portable
// backend is four plain floats: chunked like the vector backends (per-chunk costs amortised over four
// keys), and the compiler may vectorize it for the build's baseline ISA.
struct VecScalar : QuantScalar {
  static constexpr int W = 4, kAccRegs = 8, kMaxRows = 2;
  template <class Op>
  static F map(F a, F b, Op op) {
    F r;
    for (int i = 0; i < 4; ++i) r.v[i] = op(a.v[i], b.v[i]);
    return r;
  }
  static F zero() { return set1(0.0f); }
  static F set1(float x) { return F{{x, x, x, x}}; }
  static F load(const float* p) { return F{{p[0], p[1], p[2], p[3]}}; }
  static void store(float* p, F v) {
    for (int i = 0; i < 4; ++i) p[i] = v.v[i];
  }
  static F load_bf16(const uint16_t* p) {
    return F{{bf16_to_f32(p[0]), bf16_to_f32(p[1]), bf16_to_f32(p[2]), bf16_to_f32(p[3])}};
  }
  static void store_bf16(uint16_t* p, F v) {
    for (int i = 0; i < 4; ++i) p[i] = f32_to_bf16(v.v[i]);
  }
  static F load_fp16(const uint16_t* p) {
    return F{{fp16_to_f32(p[0]), fp16_to_f32(p[1]), fp16_to_f32(p[2]), fp16_to_f32(p[3])}};
  }
  static F add(F a, F b) { return map(a, b, [](float x, float y) { return x + y; }); }
  static F sub(F a, F b) { return map(a, b, [](float x, float y) { return x - y; }); }
  static F mul(F a, F b) { return map(a, b, [](float x, float y) { return x * y; }); }
  static F div(F a, F b) { return map(a, b, [](float x, float y) { return x / y; }); }
  static F fma(F a, F b, F c) { return add(mul(a, b), c); }
  static F exp(F x) { return F{{std::exp(x.v[0]), std::exp(x.v[1]), std::exp(x.v[2]), std::exp(x.v[3])}}; }
  static F abs(F a) { return F{{std::fabs(a.v[0]), std::fabs(a.v[1]), std::fabs(a.v[2]), std::fabs(a.v[3])}}; }
  static F max(F a, F b) { return map(a, b, [](float x, float y) { return std::max(x, y); }); }
  static float reduce_add(F v) { return (v.v[0] + v.v[1]) + (v.v[2] + v.v[3]); }
  static float reduce_max(F v) { return std::max(std::max(v.v[0], v.v[1]), std::max(v.v[2], v.v[3])); }
  static F transpose_add(const F* v) {
    return F{{reduce_add(v[0]), reduce_add(v[1]), reduce_add(v[2]), reduce_add(v[3])}};
  }
  static void store_sum4(float* out, const F* v) { store(out, transpose_add(v)); }
  static F keep_first(F v, int n, F fill) {
    for (int i = n < 0 ? 0 : n; i < 4; ++i) v.v[i] = fill.v[i];
    return v;
  }
  static bool any_gt(F a, F b) { return a.v[0] > b.v[0] || a.v[1] > b.v[1] || a.v[2] > b.v[2] || a.v[3] > b.v[3]; }
  static constexpr size_t lanes() { return 4; }
  static F load_n(const float* p, size_t n) {
    F r = zero();
    for (size_t i = 0; i < n; ++i) r.v[i] = p[i];
    return r;
  }
  static void store_n(float* p, F v, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = v.v[i];
  }
  static F load_bf16_n(const uint16_t* p, size_t n) {
    F r = zero();
    for (size_t i = 0; i < n; ++i) r.v[i] = bf16_to_f32(p[i]);
    return r;
  }
  static void store_bf16_n(uint16_t* p, F v, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(v.v[i]);
  }
  static F load_fp16_n(const uint16_t* p, size_t n) {
    F r = zero();
    for (size_t i = 0; i < n; ++i) r.v[i] = fp16_to_f32(p[i]);
    return r;
  }
  static void store_fp16(uint16_t* p, F v) { store_fp16_n(p, v, 4); }
  static void store_fp16_n(uint16_t* p, F v, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = f32_to_fp16(v.v[i]);
  }
  static F swap_pairs(F v) { return F{{v.v[1], v.v[0], v.v[3], v.v[2]}}; }
  static F dup_pairs(const float* p) { return F{{p[0], p[0], p[1], p[1]}}; }
  static F dup_pairs_n(const float* p, size_t n) { return n >= 4 ? dup_pairs(p) : F{{p[0], p[0], 0.0f, 0.0f}}; }
  static F neg_even(F v) { return F{{-v.v[0], v.v[1], -v.v[2], v.v[3]}}; }
};

#ifdef ENGINE_X86
struct VecAvx2 : QuantAvx2 {
  using F = __m256;
  static constexpr int W = 8, kAccRegs = 8, kMaxRows = 2;  // 16 ymm registers
  ENGINE_AVX2 static F zero() { return _mm256_setzero_ps(); }
  ENGINE_AVX2 static F set1(float x) { return _mm256_set1_ps(x); }
  ENGINE_AVX2 static F load(const float* p) { return _mm256_loadu_ps(p); }
  ENGINE_AVX2 static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  ENGINE_AVX2 static F load_bf16(const uint16_t* p) { return bf16x8_load(p); }
  ENGINE_AVX2 static void store_bf16(uint16_t* p, F v) { bf16x8_store(p, v); }
  ENGINE_AVX2 static F load_fp16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ENGINE_AVX2 static F add(F a, F b) { return _mm256_add_ps(a, b); }
  ENGINE_AVX2 static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  ENGINE_AVX2 static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  ENGINE_AVX2 static F div(F a, F b) { return _mm256_div_ps(a, b); }
  ENGINE_AVX2 static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  ENGINE_AVX2 static F exp(F x) { return exp256(x); }
  ENGINE_AVX2 static F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  ENGINE_AVX2 static F max(F a, F b) { return _mm256_max_ps(a, b); }
  ENGINE_AVX2 static float reduce_add(F v) { return hsum8(v); }
  ENGINE_AVX2 static float reduce_max(F v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  ENGINE_AVX2 static F transpose_add(const F* v) {  // 8 vectors: unpack/shuffle/permute tree
    __m256 a[4], b[2];
    for (int i = 0; i < 4; ++i)
      a[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; ++i)
      b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                           _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
  }
  // out[j] = the sum of the lanes of v[j], j < 4 (the 4-row reductions of moe_dot_impl.h).
  ENGINE_AVX2 static void store_sum4(float* out, const F* v) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }
  ENGINE_AVX2 static F keep_first(F v, int n, F fill) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_blendv_ps(fill, v, _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(n)), _CMP_LT_OQ));
  }
  ENGINE_AVX2 static bool any_gt(F a, F b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0; }
  static constexpr size_t lanes() { return 8; }
  ENGINE_AVX2 static __m256i mask_n(size_t n) {  // lanes < n all ones
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  ENGINE_AVX2 static F load_n(const float* p, size_t n) { return _mm256_maskload_ps(p, mask_n(n)); }
  ENGINE_AVX2 static void store_n(float* p, F v, size_t n) { _mm256_maskstore_ps(p, mask_n(n), v); }
  // n < 8 halfwords in lanes < n, 0 elsewhere, without a store-forwarding stall through memory: the
  // n/2 whole dwords by maskload, an odd last halfword moved into place by pshufb.
  ENGINE_AVX2 static __m128i u16_load_n(const uint16_t* p, size_t n) {
    alignas(16) static const int8_t place[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  1,  -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    __m128i h = _mm_maskload_epi32(reinterpret_cast<const int*>(p), _mm256_castsi256_si128(mask_n(n / 2)));
    if (n & 1) {
      const __m128i ctrl = _mm_loadu_si128(reinterpret_cast<const __m128i*>(place + 16 - 2 * (n - 1)));
      h = _mm_or_si128(h, _mm_shuffle_epi8(_mm_cvtsi32_si128(p[n - 1]), ctrl));
    }
    return h;
  }
  ENGINE_AVX2 static F load_bf16_n(const uint16_t* p, size_t n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(u16_load_n(p, n)), 16));
  }
  ENGINE_AVX2 static void store_bf16_n(uint16_t* p, F v, size_t n) {
    alignas(16) uint16_t b[8];
    store_bf16(b, v);
    copy_small<16>(p, b, n * 2);
  }
  ENGINE_AVX2 static F load_fp16_n(const uint16_t* p, size_t n) { return _mm256_cvtph_ps(u16_load_n(p, n)); }
  ENGINE_AVX2 static void store_fp16(uint16_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  ENGINE_AVX2 static void store_fp16_n(uint16_t* p, F v, size_t n) {
    alignas(16) uint16_t b[8];
    store_fp16(b, v);
    copy_small<16>(p, b, n * 2);
  }
  ENGINE_AVX2 static F swap_pairs(F v) { return _mm256_permute_ps(v, 0xB1); }
  ENGINE_AVX2 static F dup_pairs(const float* p) {
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  }
  ENGINE_AVX2 static F dup_pairs_n(const float* p, size_t n) {
    const __m128 h = _mm_maskload_ps(p, _mm256_castsi256_si128(mask_n(n / 2)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(h), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  }
  ENGINE_AVX2 static F neg_even(F v) { return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_set1_epi64x(0x80000000LL))); }
};

struct VecAvx512 : QuantAvx512 {
  using F = __m512;
  static constexpr int W = 16, kAccRegs = 16, kMaxRows = 4;  // 32 zmm registers
  ENGINE_AVX512 static F zero() { return _mm512_setzero_ps(); }
  ENGINE_AVX512 static F set1(float x) { return _mm512_set1_ps(x); }
  ENGINE_AVX512 static F load(const float* p) { return _mm512_loadu_ps(p); }
  ENGINE_AVX512 static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  ENGINE_AVX512 static F load_bf16(const uint16_t* p) { return bf16x16_load(p, 0xffff); }
  ENGINE_AVX512 static void store_bf16(uint16_t* p, F v) { bf16x16_store(p, v, 0xffff); }
  ENGINE_AVX512 static F load_fp16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  ENGINE_AVX512 static F add(F a, F b) { return _mm512_add_ps(a, b); }
  ENGINE_AVX512 static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  ENGINE_AVX512 static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  ENGINE_AVX512 static F div(F a, F b) { return _mm512_div_ps(a, b); }
  ENGINE_AVX512 static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  ENGINE_AVX512 static F exp(F x) { return exp512(x); }
  ENGINE_AVX512 static F abs(F a) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), a); }
  ENGINE_AVX512 static F max(F a, F b) { return _mm512_max_ps(a, b); }
  ENGINE_AVX512 static float reduce_add(F v) { return _mm512_reduce_add_ps(v); }
  ENGINE_AVX512 static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }
  ENGINE_AVX512 static F transpose_add(const F* v) {  // 16 vectors: 45 shuffles/adds for 16 sums
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i)
      a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i)
      b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; ++i)
      c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  }
  ENGINE_AVX512 static void store_sum4(float* out, const F* v) { _mm_storeu_ps(out, hsum4(v[0], v[1], v[2], v[3])); }
  ENGINE_AVX512 static F keep_first(F v, int n, F fill) { return _mm512_mask_mov_ps(fill, tail_mask(n), v); }
  ENGINE_AVX512 static bool any_gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
  static constexpr size_t lanes() { return 16; }
  ENGINE_AVX512 static F load_n(const float* p, size_t n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  ENGINE_AVX512 static void store_n(float* p, F v, size_t n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  ENGINE_AVX512 static F load_bf16_n(const uint16_t* p, size_t n) { return bf16x16_load(p, tail_mask(n)); }
  ENGINE_AVX512 static void store_bf16_n(uint16_t* p, F v, size_t n) { bf16x16_store(p, v, tail_mask(n)); }
  ENGINE_AVX512 static F load_fp16_n(const uint16_t* p, size_t n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail_mask(n), p));
  }
  ENGINE_AVX512 static void store_fp16(uint16_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  ENGINE_AVX512 static void store_fp16_n(uint16_t* p, F v, size_t n) {
    _mm256_mask_storeu_epi16(p, tail_mask(n), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  ENGINE_AVX512 static F swap_pairs(F v) { return _mm512_permute_ps(v, 0xB1); }
  ENGINE_AVX512 static F dup_pairs_n(const float* p, size_t n) {
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m256 h = _mm256_maskz_loadu_ps(static_cast<__mmask8>(tail_mask(n / 2)), p);
    return _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(h));
  }
  ENGINE_AVX512 static F dup_pairs(const float* p) {
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(p)));
  }
  ENGINE_AVX512 static F neg_even(F v) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi64(0x80000000LL)));
  }
};

// VecAvx512 and the integer dot of AVX512_VNNI (vpdpbusd: u8 x s8 -> s32); kernels on it carry
// ENGINE_AVX512VNNI and run only where cpu_has_avx512_vnni().
struct VecAvx512Vnni : VecAvx512 {
  ENGINE_AVX512VNNI static I dot_u8s8(I acc, B u, B s) { return _mm512_dpbusd_epi32(acc, u, s); }
  ENGINE_AVX512VNNI static I dot_s8s8(I acc, B a, B b) {  // |a| times b carrying a's sign
    const __m512i neg_b = _mm512_mask_sub_epi8(b, _mm512_movepi8_mask(a), _mm512_setzero_si512(), b);
    return dot_u8s8(acc, _mm512_abs_epi8(a), neg_b);
  }
};
#endif  // ENGINE_X86

#ifdef ENGINE_ARM64
struct VecNeon : QuantNeon {
  using F = float32x4_t;
  static constexpr int W = 4, kAccRegs = 16, kMaxRows = 4;  // 32 q registers
  static F zero() { return vdupq_n_f32(0.0f); }
  static F set1(float x) { return vdupq_n_f32(x); }
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F v) { vst1q_f32(p, v); }
  static F load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static void store_bf16(uint16_t* p, F v) {  // round to nearest even, NaN -> 0x7FC0 (as f32_to_bf16)
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(odd, vdupq_n_u32(0x7fff))), 16);
    r = vbslq_u32(vceqq_f32(v, v), r, vdupq_n_u32(0x7fc0));
    vst1_u16(p, vmovn_u32(r));
  }
  static F load_fp16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F exp(F x);
  static F abs(F a) { return vabsq_f32(a); }
  static F max(F a, F b) { return vmaxq_f32(a, b); }
  static float reduce_add(F v) { return vaddvq_f32(v); }
  static float reduce_max(F v) { return vmaxvq_f32(v); }
  static F transpose_add(const F* v) { return vpaddq_f32(vpaddq_f32(v[0], v[1]), vpaddq_f32(v[2], v[3])); }
  static void store_sum4(float* out, const F* v) { vst1q_f32(out, transpose_add(v)); }
  static F keep_first(F v, int n, F fill) {
    const float lanes[4] = {0, 1, 2, 3};
    return vbslq_f32(vcltq_f32(vld1q_f32(lanes), vdupq_n_f32(static_cast<float>(n))), v, fill);
  }
  static bool any_gt(F a, F b) { return vmaxvq_u32(vcgtq_f32(a, b)) != 0; }
  static constexpr size_t lanes() { return 4; }
  static F load_n(const float* p, size_t n) {
    float b[4] = {0, 0, 0, 0};
    copy_small<16>(b, p, n * 4);
    return vld1q_f32(b);
  }
  static void store_n(float* p, F v, size_t n) {
    float b[4];
    vst1q_f32(b, v);
    copy_small<16>(p, b, n * 4);
  }
  static F load_bf16_n(const uint16_t* p, size_t n) {
    uint16_t b[4] = {0, 0, 0, 0};
    copy_small<8>(b, p, n * 2);
    return load_bf16(b);
  }
  static void store_bf16_n(uint16_t* p, F v, size_t n) {
    uint16_t b[4];
    store_bf16(b, v);
    copy_small<8>(p, b, n * 2);
  }
  static F load_fp16_n(const uint16_t* p, size_t n) {
    uint16_t b[4] = {0, 0, 0, 0};
    copy_small<8>(b, p, n * 2);
    return load_fp16(b);
  }
  static void store_fp16(uint16_t* p, F v) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }
  static void store_fp16_n(uint16_t* p, F v, size_t n) {
    uint16_t b[4];
    store_fp16(b, v);
    copy_small<8>(p, b, n * 2);
  }
  static F swap_pairs(F v) { return vrev64q_f32(v); }
  static F dup_pairs(const float* p) {
    const float32x2_t h = vld1_f32(p);
    return vcombine_f32(vdup_lane_f32(h, 0), vdup_lane_f32(h, 1));
  }
  static F dup_pairs_n(const float* p, size_t n) {
    return n >= 4 ? dup_pairs(p) : vcombine_f32(vdup_n_f32(p[0]), vdup_n_f32(0.0f));
  }
  static F neg_even(F v) {
    return vreinterpretq_f32_u64(veorq_u64(vreinterpretq_u64_f32(v), vdupq_n_u64(0x80000000ULL)));
  }
};

// VecNeon and the Armv8.2 dotprod integer dot (SDOT: s8 x s8 -> s32, four products per lane); kernels on it
// are compiled for dotprod (gguf_q8act_neon_dotprod.cpp) and run only where cpu_has_dotprod().
#if defined(__clang__)
#define ENGINE_DOTPROD __attribute__((target("dotprod")))
#else
#define ENGINE_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
struct VecNeonDot : VecNeon {
  ENGINE_DOTPROD static I dot_s8s8(I acc, B a, B b) { return vdotq_s32(acc, a, b); }
  ENGINE_DOTPROD static I dot_u8s8(I acc, B u, B s) { return vdotq_s32(acc, u, s); }  // u <= 127: a valid s8
};
#endif  // ENGINE_ARM64

#ifdef ENGINE_VSX
struct VecVsx : QuantVsx {
  using F = __vector float;
  static constexpr int W = 4, kAccRegs = 16, kMaxRows = 4;  // 64 VSX registers
  static F zero() { return vec_splats(0.0f); }
  static F set1(float x) { return vec_splats(x); }
  static F load(const float* p) { return vec_xl(0, p); }
  static void store(float* p, F v) { vec_xst(v, 0, p); }
  static F load_bf16(const uint16_t* p) {
    const __vector unsigned int u = {p[0], p[1], p[2], p[3]};
    return reinterpret_cast<F>(vec_sl(u, vec_splats(16u)));
  }
  static void store_bf16(uint16_t* p, F v) {
    for (int i = 0; i < 4; ++i) p[i] = f32_to_bf16(v[i]);
  }
  static F load_fp16(const uint16_t* p) {
#ifdef _ARCH_PWR9  // one 8-byte load splatted to both halves, then xvcvhpsp: four fp16 lanes to fp32
    unsigned long long bits;
    std::memcpy(&bits, p, 8);
    const __vector unsigned long long d = vec_splats(bits);
    return vec_extract_fp32_from_shorth(reinterpret_cast<__vector unsigned short>(d));
#else
    return F{fp16_to_f32(p[0]), fp16_to_f32(p[1]), fp16_to_f32(p[2]), fp16_to_f32(p[3])};
#endif
  }
  static F add(F a, F b) { return vec_add(a, b); }
  static F sub(F a, F b) { return vec_sub(a, b); }
  static F mul(F a, F b) { return vec_mul(a, b); }
  static F div(F a, F b) { return vec_div(a, b); }
  static F fma(F a, F b, F c) { return vec_madd(a, b, c); }
  static F exp(F x);
  static F abs(F a) { return vec_abs(a); }
  static F max(F a, F b) { return vec_max(a, b); }
  static float reduce_add(F v) { return (v[0] + v[1]) + (v[2] + v[3]); }
  static float reduce_max(F v) { return std::fmax(std::fmax(v[0], v[1]), std::fmax(v[2], v[3])); }
  static F transpose_add(const F* v) {
    const F a = vec_mergeh(v[0], v[1]), b = vec_mergel(v[0], v[1]);  // [x0 y0 x1 y1], [x2 y2 x3 y3]
    const F c = vec_mergeh(v[2], v[3]), d = vec_mergel(v[2], v[3]);
    const F s01 = vec_add(a, b), s23 = vec_add(c, d);  // [x02 y02 x13 y13], [z02 w02 z13 w13]
    using D2 = __vector double;  // pairs of lanes moved as one 64-bit element
    const D2 lo = vec_mergeh(reinterpret_cast<D2>(s01), reinterpret_cast<D2>(s23));
    const D2 hi = vec_mergel(reinterpret_cast<D2>(s01), reinterpret_cast<D2>(s23));
    return vec_add(reinterpret_cast<F>(lo), reinterpret_cast<F>(hi));
  }
  static void store_sum4(float* out, const F* v) { store(out, transpose_add(v)); }
  static F keep_first(F v, int n, F fill) {
    const F lane = {0, 1, 2, 3};
    return vec_sel(fill, v, vec_cmplt(lane, vec_splats(static_cast<float>(n))));
  }
  static bool any_gt(F a, F b) { return vec_any_gt(a, b); }
  static constexpr size_t lanes() { return 4; }
  static F load_n(const float* p, size_t n) {
    float b[4] = {0, 0, 0, 0};
    copy_small<16>(b, p, n * 4);
    return load(b);
  }
  static void store_n(float* p, F v, size_t n) {
    float b[4];
    store(b, v);
    copy_small<16>(p, b, n * 4);
  }
  static F load_bf16_n(const uint16_t* p, size_t n) {
    uint16_t b[4] = {0, 0, 0, 0};
    copy_small<8>(b, p, n * 2);
    return load_bf16(b);
  }
  static void store_bf16_n(uint16_t* p, F v, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(v[i]);
  }
  static F load_fp16_n(const uint16_t* p, size_t n) {
    uint16_t b[4] = {0, 0, 0, 0};
    copy_small<8>(b, p, n * 2);
    return load_fp16(b);
  }
  static void store_fp16(uint16_t* p, F v) {
#ifdef _ARCH_PWR9  // xvcvsphp (four fp32 lanes to fp16, nearest even) and a pack: halfwords 0..3
    const __vector unsigned short h = vec_pack_to_short_fp32(v, v);
    std::memcpy(p, &h, 8);
#else
    for (int i = 0; i < 4; ++i) p[i] = f32_to_fp16(v[i]);
#endif
  }
  static void store_fp16_n(uint16_t* p, F v, size_t n) {
    uint16_t b[4];
    store_fp16(b, v);
    copy_small<8>(p, b, n * 2);
  }
  static F swap_pairs(F v) {  // rotating each 64-bit element by 32 bits swaps its two floats
    using U2 = __vector unsigned long long;
    return reinterpret_cast<F>(vec_rl(reinterpret_cast<U2>(v), vec_splats(32ULL)));
  }
  static F dup_pairs(const float* p) { return F{p[0], p[0], p[1], p[1]}; }
  static F dup_pairs_n(const float* p, size_t n) { return n >= 4 ? dup_pairs(p) : F{p[0], p[0], 0.0f, 0.0f}; }
  static F neg_even(F v) {
    using U2 = __vector unsigned long long;
    return reinterpret_cast<F>(vec_xor(reinterpret_cast<U2>(v), vec_splats(0x80000000ULL)));
  }
};
#endif  // ENGINE_VSX

// expf for the 4-lane backends: the constants and clamps of activation_exp_x86.h (about 2 ulp), with
// 2^n built in the exponent field.
#if defined(ENGINE_ARM64) || defined(ENGINE_VSX)
constexpr float kVExpLo = -87.33654475f, kVExpHi = 88.02969193f, kVLog2e = 1.44269504088896341f;
constexpr float kVLn2Hi = 0.693359375f, kVLn2Lo = -2.12194440e-4f;
constexpr float kVP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                          4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
#endif
#ifdef ENGINE_ARM64
inline float32x4_t VecNeon::exp(float32x4_t x) {
  x = vminq_f32(vdupq_n_f32(kVExpHi), vmaxq_f32(vdupq_n_f32(kVExpLo), x));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(kVLog2e)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(kVLn2Hi));
  r = vfmsq_f32(r, n, vdupq_n_f32(kVLn2Lo));
  float32x4_t y = vdupq_n_f32(kVP[0]);
  for (int i = 1; i < 6; ++i) y = vfmaq_f32(vdupq_n_f32(kVP[i]), y, r);
  y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), y, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(e));
}
#endif
#ifdef ENGINE_VSX
inline __vector float VecVsx::exp(__vector float x) {
  x = vec_min(vec_splats(kVExpHi), vec_max(vec_splats(kVExpLo), x));
  const __vector float n = vec_round(vec_mul(x, vec_splats(kVLog2e)));
  __vector float r = vec_nmsub(n, vec_splats(kVLn2Hi), x);
  r = vec_nmsub(n, vec_splats(kVLn2Lo), r);
  __vector float y = vec_splats(kVP[0]);
  for (int i = 1; i < 6; ++i) y = vec_madd(y, r, vec_splats(kVP[i]));
  y = vec_madd(y, vec_mul(r, r), vec_add(r, vec_splats(1.0f)));
  const __vector signed int e = vec_sl(vec_add(vec_cts(n, 0), vec_splats(127)), vec_splats(23u));
  return vec_mul(y, reinterpret_cast<__vector float>(e));
}
#endif

}  // namespace
}  // namespace engine_cpu

#if defined(ENGINE_RVV) && defined(__riscv_vector)
#include "vec_rvv.h"  // VecRvv (length agnostic) and VecRvv128 (fixed 4 lanes): the RVV 1.0 backends
#endif
