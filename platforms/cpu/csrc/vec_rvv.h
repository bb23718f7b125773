// The RISC-V V 1.0 backends of vec.h (included by vec.h in files compiled with -march=...v only).
//
// * VecRvv: vector-length agnostic, for the streaming (elementwise) kernels. F is vfloat32m2_t (two
//   registers: VLEN/16 lanes), every operation runs at VLMAX = lanes(), read at run time, and the
//   `*_n` loads are tail-undisturbed over a zero vector, so one binary is correct at any VLEN.
//   It has the streaming members of the contract and the arithmetic (no transpose_add / keep_first:
//   kernels that keep arrays of vectors cannot hold sizeless types).
// * VecRvv128: the fixed-width contract (W = 4) on 128-bit GNU vectors, which clang lowers to RVV
//   instructions at vl = 4 (vsetivli); correct at every VLEN (V implies VLEN >= 128) but it does not
//   widen with VLEN. The attention tile (arrays of vectors in registers) is instantiated on it.
#pragma once

#ifndef __riscv_vector
#error "vec_rvv.h needs -march=...v (the *_rvv.cpp files get it from CMakeLists.txt)"
#endif
#include <riscv_vector.h>

#include <cstdint>
#include <cstring>

#include "convert.h"

namespace engine_cpu {
namespace {

constexpr float kRvvExpLo = -87.33654475f, kRvvExpHi = 88.02969193f, kRvvLog2e = 1.44269504088896341f;
constexpr float kRvvLn2Hi = 0.693359375f, kRvvLn2Lo = -2.12194440e-4f;
constexpr float kRvvP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

struct VecRvv {
  using F = vfloat32m2_t;
  using U = vuint32m2_t;
  static size_t lanes() { return __riscv_vsetvlmax_e32m2(); }
  static F zero() { return set1(0.0f); }
  static F set1(float x) { return __riscv_vfmv_v_f_f32m2(x, lanes()); }
  static F load(const float* p) { return __riscv_vle32_v_f32m2(p, lanes()); }
  static void store(float* p, F v) { __riscv_vse32_v_f32m2(p, v, lanes()); }
  static F load_n(const float* p, size_t n) { return __riscv_vle32_v_f32m2_tu(zero(), p, n); }
  static void store_n(float* p, F v, size_t n) { __riscv_vse32_v_f32m2(p, v, n); }
  static U u16_n(const uint16_t* p, size_t n) {  // n halfwords widened to u32 lanes, 0 past n
    const vuint16m1_t h = __riscv_vle16_v_u16m1_tu(__riscv_vmv_v_x_u16m1(0, lanes()), p, n);
    return __riscv_vzext_vf2_u32m2(h, lanes());
  }
  static F as_f(U u) { return __riscv_vreinterpret_v_u32m2_f32m2(u); }
  static U as_u(F v) { return __riscv_vreinterpret_v_f32m2_u32m2(v); }
  static F load_bf16_n(const uint16_t* p, size_t n) { return as_f(__riscv_vsll_vx_u32m2(u16_n(p, n), 16, lanes())); }
  static F load_bf16(const uint16_t* p) { return load_bf16_n(p, lanes()); }
  static void store_bf16_n(uint16_t* p, F v, size_t n) {  // round to nearest even, NaN -> 0x7FC0
    const size_t vl = lanes();
    const U u = as_u(v);
    const U odd = __riscv_vand_vx_u32m2(__riscv_vsrl_vx_u32m2(u, 16, vl), 1, vl);
    U r = __riscv_vadd_vv_u32m2(u, __riscv_vadd_vx_u32m2(odd, 0x7fff, vl), vl);
    r = __riscv_vmerge_vxm_u32m2(r, 0x7fc00000u, __riscv_vmfne_vv_f32m2_b16(v, v, vl), vl);
    __riscv_vse16_v_u16m1(p, __riscv_vnsrl_wx_u16m1(r, 16, vl), n);
  }
  static void store_bf16(uint16_t* p, F v) { store_bf16_n(p, v, lanes()); }
  // fp16 <-> fp32 with integer operations (QEMU 7.2 has no Zvfhmin): exact, as convert.h.
  static F load_fp16_n(const uint16_t* p, size_t n) {
    const size_t vl = lanes();
    const U h = u16_n(p, n);
    const U sign = __riscv_vsll_vx_u32m2(__riscv_vand_vx_u32m2(h, 0x8000u, vl), 16, vl);
    const U em = __riscv_vsll_vx_u32m2(__riscv_vand_vx_u32m2(h, 0x7fffu, vl), 13, vl);
    // Normals and subnormals: the bits as an fp32 times 2^112 rebias the exponent exactly.
    U r = as_u(__riscv_vfmul_vf_f32m2(as_f(em), 5.192296858534828e33f, vl));
    const vbool16_t special = __riscv_vmsgeu_vx_u32m2_b16(em, 0x7c00u << 13, vl);  // inf / NaN
    r = __riscv_vmerge_vvm_u32m2(r, __riscv_vor_vx_u32m2(em, 0x7f800000u, vl), special, vl);
    return as_f(__riscv_vor_vv_u32m2(r, sign, vl));
  }
  static F load_fp16(const uint16_t* p) { return load_fp16_n(p, lanes()); }
  static void store_fp16_n(uint16_t* p, F v, size_t n) {  // round to nearest even; NaN -> 0x7E00
    const size_t vl = lanes();
    const U u0 = as_u(v);
    const U sign = __riscv_vand_vx_u32m2(u0, 0x80000000u, vl);
    const U a = __riscv_vxor_vv_u32m2(u0, sign, vl);
    // Normal results: rebias, round the 13 dropped bits to nearest even.
    const U odd = __riscv_vand_vx_u32m2(__riscv_vsrl_vx_u32m2(a, 13, vl), 1, vl);
    U r = __riscv_vadd_vv_u32m2(__riscv_vadd_vx_u32m2(a, 0xc8000fffu, vl), odd, vl);  // - (112 << 23) + 0xfff
    r = __riscv_vsrl_vx_u32m2(r, 13, vl);
    // Subnormal results (|v| < 2^-14): adding 0.5 (2^-1) aligns the bits at 2^-24 with FP rounding.
    const U sub = __riscv_vsub_vx_u32m2(as_u(__riscv_vfadd_vf_f32m2(as_f(a), 0.5f, vl)), 0x3f000000u, vl);
    r = __riscv_vmerge_vvm_u32m2(r, sub, __riscv_vmsltu_vx_u32m2_b16(a, 0x38800000u, vl), vl);
    r = __riscv_vmerge_vxm_u32m2(r, 0x7c00u, __riscv_vmsgeu_vx_u32m2_b16(a, 0x47800000u, vl), vl);
    r = __riscv_vmerge_vxm_u32m2(r, 0x7e00u, __riscv_vmsgtu_vx_u32m2_b16(a, 0x7f800000u, vl), vl);
    r = __riscv_vor_vv_u32m2(r, __riscv_vsrl_vx_u32m2(sign, 16, vl), vl);
    __riscv_vse16_v_u16m1(p, __riscv_vncvt_x_x_w_u16m1(r, vl), n);
  }
  static void store_fp16(uint16_t* p, F v) { store_fp16_n(p, v, lanes()); }
  static F add(F a, F b) { return __riscv_vfadd_vv_f32m2(a, b, lanes()); }
  static F sub(F a, F b) { return __riscv_vfsub_vv_f32m2(a, b, lanes()); }
  static F mul(F a, F b) { return __riscv_vfmul_vv_f32m2(a, b, lanes()); }
  static F div(F a, F b) { return __riscv_vfdiv_vv_f32m2(a, b, lanes()); }
  static F fma(F a, F b, F c) { return __riscv_vfmacc_vv_f32m2(c, a, b, lanes()); }
  static F exp(F x) {  // the algorithm and constants of vec.h's 4-lane exp
    const size_t vl = lanes();
    x = __riscv_vfmin_vf_f32m2(__riscv_vfmax_vf_f32m2(x, kRvvExpLo, vl), kRvvExpHi, vl);
    const vint32m2_t ni = __riscv_vfcvt_x_f_v_i32m2(__riscv_vfmul_vf_f32m2(x, kRvvLog2e, vl), vl);  // nearest even
    const F n = __riscv_vfcvt_f_x_v_f32m2(ni, vl);
    F r = __riscv_vfnmsac_vf_f32m2(x, kRvvLn2Hi, n, vl);
    r = __riscv_vfnmsac_vf_f32m2(r, kRvvLn2Lo, n, vl);
    F y = set1(kRvvP[0]);
    for (int i = 1; i < 6; ++i) y = __riscv_vfmadd_vv_f32m2(y, r, set1(kRvvP[i]), vl);
    y = __riscv_vfmacc_vv_f32m2(__riscv_vfadd_vf_f32m2(r, 1.0f, vl), y, __riscv_vfmul_vv_f32m2(r, r, vl), vl);
    const vint32m2_t e = __riscv_vsll_vx_i32m2(__riscv_vadd_vx_i32m2(ni, 127, vl), 23, vl);
    return __riscv_vfmul_vv_f32m2(y, __riscv_vreinterpret_v_i32m2_f32m2(e), vl);
  }
  static float reduce_add(F v) {
    const vfloat32m1_t z = __riscv_vfmv_v_f_f32m1(0.0f, 1);
    return __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m2_f32m1(v, z, lanes()));
  }
  static F swap_pairs(F v) {
    const size_t vl = lanes();
    return __riscv_vrgather_vv_f32m2(v, __riscv_vxor_vx_u32m2(__riscv_vid_v_u32m2(vl), 1, vl), vl);
  }
  static F dup_pairs_n(const float* p, size_t n) {
    const size_t vl = lanes();
    return __riscv_vrgather_vv_f32m2(load_n(p, n / 2), __riscv_vsrl_vx_u32m2(__riscv_vid_v_u32m2(vl), 1, vl), vl);
  }
  static F dup_pairs(const float* p) { return dup_pairs_n(p, lanes()); }
  static F neg_even(F v) {
    const size_t vl = lanes();
    const U even = __riscv_vxor_vx_u32m2(__riscv_vand_vx_u32m2(__riscv_vid_v_u32m2(vl), 1, vl), 1, vl);
    return as_f(__riscv_vxor_vv_u32m2(as_u(v), __riscv_vsll_vx_u32m2(even, 31, vl), vl));
  }
};

// Fixed 4 lanes on GNU vector types: clang emits RVV instructions for them (vsetivli 4).
struct VecRvv128 {
  typedef float F __attribute__((vector_size(16)));
  typedef int32_t I __attribute__((vector_size(16)));
  typedef uint32_t U __attribute__((vector_size(16)));
  static constexpr int W = 4, kAccRegs = 16, kMaxRows = 4;  // 32 vector registers
  static F zero() { return set1(0.0f); }
  static F set1(float x) { return F{x, x, x, x}; }
  static F load(const float* p) {
    F r;
    std::memcpy(&r, p, 16);
    return r;
  }
  static void store(float* p, F v) { std::memcpy(p, &v, 16); }
  static F load_bf16(const uint16_t* p) {
    const U u = {p[0], p[1], p[2], p[3]};
    return reinterpret_cast<F>(u << 16);
  }
  static void store_bf16(uint16_t* p, F v) {
    for (int i = 0; i < 4; ++i) p[i] = f32_to_bf16(v[i]);
  }
  static F load_fp16(const uint16_t* p) {  // VecRvv::load_fp16_n's integer conversion, four lanes
    const U h = {p[0], p[1], p[2], p[3]};
    const U em = (h & 0x7fffu) << 13;
    const U r = reinterpret_cast<U>(reinterpret_cast<F>(em) * 5.192296858534828e33f);  // * 2^112
    const U special = em >= (0x7c00u << 13);  // inf / NaN: all ones where true
    return reinterpret_cast<F>(((em | 0x7f800000u) & special) | (r & ~special) | ((h & 0x8000u) << 16));
  }
  static void store_fp16(uint16_t* p, F v) {
    for (int i = 0; i < 4; ++i) p[i] = f32_to_fp16(v[i]);
  }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F fma(F a, F b, F c) { return __builtin_elementwise_fma(a, b, c); }
  static F exp(F x) {
    x = __builtin_elementwise_min(set1(kRvvExpHi), __builtin_elementwise_max(set1(kRvvExpLo), x));
    const F n = __builtin_elementwise_roundeven(x * kRvvLog2e);
    F r = __builtin_elementwise_fma(-n, set1(kRvvLn2Hi), x);
    r = __builtin_elementwise_fma(-n, set1(kRvvLn2Lo), r);
    F y = set1(kRvvP[0]);
    for (int i = 1; i < 6; ++i) y = __builtin_elementwise_fma(y, r, set1(kRvvP[i]));
    y = __builtin_elementwise_fma(y, r * r, r + 1.0f);
    const I e = (__builtin_convertvector(n, I) + 127) << 23;
    return y * reinterpret_cast<F>(e);
  }
  static float reduce_add(F v) { return (v[0] + v[1]) + (v[2] + v[3]); }
  static float reduce_max(F v) { return __builtin_reduce_max(v); }
  static F transpose_add(const F* v) {
    const F a = __builtin_shufflevector(v[0], v[1], 0, 4, 2, 6) + __builtin_shufflevector(v[0], v[1], 1, 5, 3, 7);
    const F b = __builtin_shufflevector(v[2], v[3], 0, 4, 2, 6) + __builtin_shufflevector(v[2], v[3], 1, 5, 3, 7);
    return __builtin_shufflevector(a, b, 0, 1, 4, 5) + __builtin_shufflevector(a, b, 2, 3, 6, 7);
  }
  static void store_sum4(float* out, const F* v) { store(out, transpose_add(v)); }
  static F keep_first(F v, int n, F fill) {
    const I lane = {0, 1, 2, 3};
    return lane < n ? v : fill;
  }
  static bool any_gt(F a, F b) { return __builtin_reduce_or(a > b) != 0; }
};

}  // namespace
}  // namespace engine_cpu
