// Fused GGUF linear: y[m, n] = sum_k x[m, k] * dequant(W)[n, k] for Q4_0 / Q4_1 / Q8_0 weights (and the K-quants
// Q4_K / Q5_K / Q6_K, always through decoded panels) kept in their GGUF blocks (never dequantized as a whole).
//
// Structure: threads split the weight rows (parallel_for over panels of kPanelRows rows).
//  * M = 1 (decode; bound by decoding and memory): where the ISA has a gemv kernel, each block is
//    decoded in registers and multiplied straight away, with software prefetch of the next rows.
//  * M > 1: a thread decodes a panel into an fp32 scratch buffer that stays in L1/L2 (values
//    bit-identical to gguf_dequantize's fp32 output), then multiplies every row of x against it with
//    fp32 FMAs, so each weight block is decoded once per call whatever M is.
// Activations stay fp32 (bf16 x is widened exactly) and nothing is quantized: the result is
// x @ dequant(W)^T up to the order and grouping of the fp32 operations (gemv: d * (q . x_b) + m * sum(x_b)
// per block, see gguf_linear_impl.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "convert.h"
#include "isa.h"

namespace engine_cpu {

struct GgufLinearArgs {
  int qtype;           // 2 = Q4_0, 3 = Q4_1, 8 = Q8_0, 12-14 = Q4_K-Q6_K (gguf.GGMLQuantizationType)
  const void* x;       // [m, k] of dtype, unit stride along k
  int64_t x_stride;    // elements between rows of x
  int64_t m;
  int64_t k;           // multiple of 32 (K-quants: 256)
  const uint8_t* w;    // [n, row_bytes] GGUF blocks
  int64_t w_stride;    // bytes between weight rows
  int64_t n;
  void* y;             // [m, n] of dtype, unit stride along n
  int64_t y_stride;    // elements between rows of y
  DType dtype;         // of x and y
};

// Validates and runs on the current ISA, threads split over weight panels; throws
// std::invalid_argument on bad arguments.
void gguf_linear(const GgufLinearArgs& a);

// The argument checks shared by gguf_linear and gguf_linear_q8act (std::invalid_argument naming `op`); the K-quants
// only where `kquants` (gguf_linear takes them, through the panel path).
void check_gguf_linear_args(const GgufLinearArgs& a, const char* op, bool kquants = false);

// Rows m0 .. m0 + mt - 1 of y, columns n0 .. n0 + cols - 1, from an fp32 tile whose row i starts at
// tile + i * tile_stride (y's dtype: copied, or rounded to bf16).
inline void store_y_tile(const GgufLinearArgs& a, const float* tile, int64_t tile_stride, int64_t m0, int mt,
                         int64_t n0, int cols) {
  for (int i = 0; i < mt; ++i) {
    const float* src = tile + i * tile_stride;
    if (a.dtype == DType::F32) {
      std::memcpy(static_cast<float*>(a.y) + (m0 + i) * a.y_stride + n0, src, sizeof(float) * cols);
    } else {
      uint16_t* dst = static_cast<uint16_t*>(a.y) + (m0 + i) * a.y_stride + n0;
      for (int j = 0; j < cols; ++j) dst[j] = f32_to_bf16(src[j]);
    }
  }
}

// Row i of x as fp32: x's own memory, or (bf16 x) `row`, widened exactly (so bf16 x gets the same math and codes
// as its fp32 values).
inline const float* x_row_f32(const GgufLinearArgs& a, int64_t i, std::vector<float>& row) {
  if (a.dtype != DType::BF16) return static_cast<const float*>(a.x) + i * a.x_stride;
  row.resize(static_cast<size_t>(a.k));
  const uint16_t* src = static_cast<const uint16_t*>(a.x) + i * a.x_stride;
  for (int64_t c = 0; c < a.k; ++c) row[c] = bf16_to_f32(src[c]);
  return row.data();
}

// Panel geometry shared by the ISA variants.
constexpr int kPanelRows = 4;  // weight rows decoded together
constexpr int kMaxTileM = 6;   // rows of x per dot call (AVX-512: 6 x 4 accumulators + 5 operands <= 32 registers)

// Per-ISA building blocks.
//  decode: rows (<= kPanelRows) weight rows -> dst [rows][k] fp32 (row stride k); `lut` maps fp16 bits
//          to fp32 (fp16_lut()).
//  dot:    out[i * kPanelRows + j] = sum_k x[i * x_stride + k] * panel[j * k + k'] for i < mt (<= kMaxTileM),
//          j < kPanelRows (the panel always has kPanelRows rows; unused ones are zero).
//  gemv:   optional (nullptr: use decode + dot): out[r] = sum_k x[k] * dequant(w row r)[k] for r < rows, the
//          blocks decoded in registers (M = 1 is bound by decoding, so the panel's store and reload
//          are worth saving there).
struct GgufLinearKernels {
  void (*decode)(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst, const float* lut);
  void (*dot)(const float* x, int64_t x_stride, int mt, const float* panel, int64_t k, float* out);
  void (*gemv)(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out,
               const float* lut);
  // decode for the K-quants (Q4_K, Q5_K, Q6_K; k a multiple of 256); nullptr: the scalar build's
  void (*decode_k)(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst);
  // M = 1 for the K-quants: out[r] = x . dequant(row r), xsum the sums of x over each 32 columns; nullptr: scalar's
  void (*gemv_k)(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x,
                 const float* xsum, float* out);
};

// fp16 bits -> fp32, all 65,536 values (built once, thread-safe). A table load replaces the
// convert-and-broadcast sequence per block scale.
const float* fp16_lut();

// The kernels gguf_linear runs on `isa` (tests compare them with the references directly).
GgufLinearKernels gguf_linear_kernels(Isa isa);
GgufLinearKernels gguf_linear_kernels_scalar();
#ifdef ENGINE_X86
GgufLinearKernels gguf_linear_kernels_avx2();
GgufLinearKernels gguf_linear_kernels_avx512();
#endif
#ifdef ENGINE_ARM64
GgufLinearKernels gguf_linear_kernels_neon();
#endif
#ifdef ENGINE_VSX
GgufLinearKernels gguf_linear_kernels_vsx();
#endif
#ifdef ENGINE_RVV
GgufLinearKernels gguf_linear_kernels_rvv();
#endif

}  // namespace engine_cpu
