// RISC-V V 1.0 kernels of the GGUF linears (Q4_0 / Q4_1 / Q8_0 weights): the fp32-activation
// gemv / decode / dot of gguf_linear.h and the Q8-activation tile of gguf_q8act.h.
//
// Vector-length agnostic: every vector length comes from vsetvli at run time, so one binary is
// correct at any VLEN >= 128 (the V extension's minimum, Zvl128b). A GGUF block is 32 values: its 16
// nibble bytes are loaded at e8/m1 (16 lanes at VLEN 128), the high nibbles slid up behind the low
// ones, and the 32 values widened to e32/m8 (32 lanes fit at VLEN 128). Streaming fp32 loops (dot)
// use the length-agnostic shape of vec.h: `for (i; i < n; i += vl) vl = vsetvl(n - i)` with
// tail-undisturbed accumulators.
#include "isa.h"

#ifdef ENGINE_RVV
#ifndef __riscv_vector
#error "compile the *_rvv.cpp files with -march=rv64gcv (CMakeLists.txt does)"
#endif
#include <riscv_vector.h>

#include "gguf_dequant.h"
#include "gguf_linear.h"
#include "gguf_q8act.h"

namespace engine_cpu {
namespace {

template <int kQ>
constexpr int kBlockBytes = kQ == kQ4_0 ? 18 : kQ == kQ4_1 ? 20 : 34;

// The 32 quant values of one block as int8 lanes 0..31 (vl = 32): Q4 nibbles 0..15 (low nibble of byte
// j is element j, high nibble element j + 16), Q8_0 bytes as they are.
template <int kQ>
inline vint8m2_t block_q(const uint8_t* qs) {
  if constexpr (kQ == kQ8_0) return __riscv_vle8_v_i8m2(reinterpret_cast<const int8_t*>(qs), 32);
  const vuint8m1_t b = __riscv_vle8_v_u8m1(qs, 16);
  const vuint8m2_t lo = __riscv_vlmul_ext_v_u8m1_u8m2(__riscv_vand_vx_u8m1(b, 0x0f, 16));
  const vuint8m2_t hi = __riscv_vlmul_ext_v_u8m1_u8m2(__riscv_vsrl_vx_u8m1(b, 4, 16));
  return __riscv_vreinterpret_v_u8m2_i8m2(__riscv_vslideup_vx_u8m2(lo, hi, 16, 32));
}

// The block's 32 dequantized values, as the reference computes them: (q - 8) * d, q * d + m, q * d.
template <int kQ>
inline vfloat32m8_t block_values(const uint8_t* blk, const float* lut) {
  const float d = lut[load_fp16(blk)];
  vint8m2_t q = block_q<kQ>(blk + (kQ == kQ4_1 ? 4 : 2));
  if constexpr (kQ == kQ4_0) q = __riscv_vsub_vx_i8m2(q, 8, 32);
  const vfloat32m8_t v = __riscv_vfwcvt_f_x_v_f32m8(__riscv_vsext_vf2_i16m4(q, 32), 32);
  const vfloat32m8_t vd = __riscv_vfmul_vf_f32m8(v, d, 32);
  if constexpr (kQ != kQ4_1) return vd;
  else return __riscv_vfadd_vf_f32m8(vd, lut[load_fp16(blk + 2)], 32);
}

void decode_rvv(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst, const float* lut) {
  with_qtype(qtype, [&](auto q) {
    constexpr int kQ = decltype(q)::value;
    constexpr int bb = kBlockBytes<kQ>;
    for (int r = 0; r < rows; ++r) {
      const uint8_t* b = w + r * w_stride;
      for (int64_t c = 0; c < k; c += 32, b += bb) __riscv_vse32_v_f32m8(dst + r * k + c, block_values<kQ>(b, lut), 32);
    }
  });
}

// Blocks decoded in registers and multiplied straight away; one row at a time (x stays in L1).
void gemv_rvv(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out,
              const float* lut) {
  with_qtype(qtype, [&](auto q) {
    constexpr int kQ = decltype(q)::value;
    constexpr int bb = kBlockBytes<kQ>;
    for (int r = 0; r < rows; ++r) {
      const uint8_t* b = w + r * w_stride;
      vfloat32m8_t acc = __riscv_vfmv_v_f_f32m8(0.0f, 32);
      for (int64_t c = 0; c < k; c += 32, b += bb)
        acc = __riscv_vfmacc_vv_f32m8(acc, block_values<kQ>(b, lut), __riscv_vle32_v_f32m8(x + c, 32), 32);
      out[r] = __riscv_vfmv_f_s_f32m1_f32(
          __riscv_vfredusum_vs_f32m8_f32m1(acc, __riscv_vfmv_s_f_f32m1(0.0f, 1), 32));
    }
  });
}

// out[i * kPanelRows + j] = x row i . panel row j: strips of vl = vsetvl(k - c) lanes, one x load shared
// by the four panel rows, accumulators tail-undisturbed so a short last strip keeps the other lanes.
void dot_rvv(const float* x, int64_t x_stride, int mt, const float* panel, int64_t k, float* out) {
  const size_t vmax = __riscv_vsetvlmax_e32m2();
  for (int i = 0; i < mt; ++i) {
    const float* xi = x + i * x_stride;
    vfloat32m2_t a0 = __riscv_vfmv_v_f_f32m2(0.0f, vmax), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < k;) {
      const size_t vl = __riscv_vsetvl_e32m2(static_cast<size_t>(k - c));
      const vfloat32m2_t xv = __riscv_vle32_v_f32m2(xi + c, vl);
      a0 = __riscv_vfmacc_vv_f32m2_tu(a0, xv, __riscv_vle32_v_f32m2(panel + c, vl), vl);
      a1 = __riscv_vfmacc_vv_f32m2_tu(a1, xv, __riscv_vle32_v_f32m2(panel + k + c, vl), vl);
      a2 = __riscv_vfmacc_vv_f32m2_tu(a2, xv, __riscv_vle32_v_f32m2(panel + 2 * k + c, vl), vl);
      a3 = __riscv_vfmacc_vv_f32m2_tu(a3, xv, __riscv_vle32_v_f32m2(panel + 3 * k + c, vl), vl);
      c += static_cast<int64_t>(vl);
    }
    const vfloat32m1_t z = __riscv_vfmv_s_f_f32m1(0.0f, 1);
    out[i * kPanelRows + 0] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m2_f32m1(a0, z, vmax));
    out[i * kPanelRows + 1] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m2_f32m1(a1, z, vmax));
    out[i * kPanelRows + 2] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m2_f32m1(a2, z, vmax));
    out[i * kPanelRows + 3] = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredusum_vs_f32m2_f32m1(a3, z, vmax));
  }
}

// Q8 activations: the integer block dot sum(q_w * q_x) by a widening multiply (int8 x int8 -> int16,
// exact: |q_w| <= 127, |q_x| <= 127) and a widening reduction into int32.
template <int kQ>
void q8_tile(const uint8_t* w, int64_t w_stride, int rows, const Q8Rows& x, int64_t x0, int mt, float* out,
             const float* lut) {
  constexpr int bb = kBlockBytes<kQ>;
  const int64_t nb = x.k / 32;
  const vint32m1_t zero = __riscv_vmv_s_x_i32m1(0, 1);
  for (int i = 0; i < mt; ++i) {
    const int8_t* xq = x.q + (x0 + i) * x.k;
    const float* xd = x.d + (x0 + i) * nb;
    const float* xs = x.s + (x0 + i) * nb;
    for (int j = 0; j < rows; ++j) {
      const uint8_t* blk = w + j * w_stride;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b, blk += bb) {
        const vint8m2_t qw = block_q<kQ>(blk + (kQ == kQ4_1 ? 4 : 2));
        const vint16m4_t prod = __riscv_vwmul_vv_i16m4(qw, __riscv_vle8_v_i8m2(xq + 32 * b, 32), 32);
        const int isum = __riscv_vmv_x_s_i32m1_i32(__riscv_vwredsum_vs_i16m4_i32m1(prod, zero, 32));
        const float dw = lut[load_fp16(blk)];
        float term = dw * xd[b] * static_cast<float>(isum);
        if constexpr (kQ == kQ4_1) term += lut[load_fp16(blk + 2)] * xs[b];
        if constexpr (kQ == kQ4_0) term += -8.0f * dw * xs[b];
        acc += term;
      }
      out[i * kQ8PanelRows + j] = acc;
    }
  }
}

void q8_tile_rvv(int qtype, const uint8_t* w, int64_t w_stride, int rows, const Q8Rows& x, int64_t x0, int mt,
                 float* out, const float* lut) {
  with_qtype(qtype, [&](auto q) { q8_tile<decltype(q)::value>(w, w_stride, rows, x, x0, mt, out, lut); });
}

}  // namespace

GgufLinearKernels gguf_linear_kernels_rvv() { return {decode_rvv, dot_rvv, gemv_rvv, nullptr, nullptr}; }

GgufQ8Kernels gguf_q8_kernels_rvv() {
  GgufQ8Kernels k = gguf_q8_kernels_scalar();  // the scalar quantizer and its layout (lanes = 1)
  k.tile = q8_tile_rvv;
  return k;
}

}  // namespace engine_cpu
#endif  // ENGINE_RVV
