// GGUF linear with Q8 activations: y[m, n] = sum_b dot(q8(x)[m, block b], W[n, block b]) for Q4_0 /
// Q4_1 / Q8_0 weights kept in their GGUF blocks, the block dots done in integers (AVX-512 VNNI, AVX2,
// AArch64 dotprod or plain NEON, POWER VSX, RISC-V V, scalar).
//
// q8(x) is the contract of engine.core.ops.gguf_q8act.quantize_q8_blocks, to the bit: per block of 32,
// d = max|x| / 127, q = round_half_even(x * (1 / d)) (0 where d = 0). A weight block is q_w * d_w + m_w
// (Q4_1; Q4_0 is m_w = -8 d_w with q_w in 0..15; Q8_0 has no m_w), so a block contributes
//   d_w * d_x * sum(q_w * q_x) + m_w * (d_x * sum(q_x)),
// the integer sum exact; only the fp32 accumulation over blocks rounds.
#pragma once

#include <cstdint>
#include <vector>

#include "convert.h"
#include "gguf_linear.h"
#include "isa.h"

namespace engine_cpu {

// The arguments of gguf_linear (gguf_linear.h). Validates (std::invalid_argument), quantizes x once, then
// threads split the weight rows.
void gguf_linear_q8act(const GgufLinearArgs& a);
// The kernel variant gguf_linear_q8act runs on now: avx512_vnni, avx2, neon_dotprod, neon, vsx, rvv or scalar.
const char* gguf_q8act_variant();

// Quantized activations as the kernels read them. Each block's scale d and d * sum(q) / kSumLanes
// ("s") are stored `lanes` times in a row (lanes = 8 on x86, where a vector of 8 or 16 fp32 lanes
// then loads them directly; 1 elsewhere), so the sum over a vector's lanes of s gives d * sum(q).
struct Q8Rows {
  const int8_t* q;   // [m][k]
  const float* d;    // [m][nb * lanes]
  const float* s;    // [m][nb * lanes]
  int64_t k;
  int lanes;
};

// The first n elements from a 64-byte boundary inside v (grown to fit): the drivers' activation buffers (the
// kernels' speed depended on malloc's 16-byte placement).
template <class T>
T* aligned64(std::vector<T>& v, size_t n) {
  v.resize(n + 64 / sizeof(T));
  const size_t skip = (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64 / sizeof(T);
  return v.data() + skip;
}

constexpr int kQ8PanelRows = 4;  // weight rows per tile call

// Per-ISA building blocks (gguf_q8act_impl.h on the vector layer; RVV's tile in gguf_linear_rvv.cpp).
//  quantize: one fp32 row of k elements -> q [k], d and s [k / 32 * lanes] in this ISA's layout.
//  tile:     out[i * kQ8PanelRows + j] = row i of x (i < mt <= max_mt) . weight row j (j < rows <= 4),
//            rows i of x starting at x row x0; `lut` maps fp16 bits to fp32.
struct GgufQ8Kernels {
  int lanes;
  int max_mt;
  void (*quantize)(const float* x, int64_t k, int8_t* q, float* d, float* s);
  void (*tile)(int qtype, const uint8_t* w, int64_t w_stride, int rows, const Q8Rows& x, int64_t x0, int mt,
               float* out, const float* lut);
};

GgufQ8Kernels gguf_q8_kernels_scalar();
#ifdef ENGINE_X86
GgufQ8Kernels gguf_q8_kernels_avx2();
GgufQ8Kernels gguf_q8_kernels_avx512();
#endif
#ifdef ENGINE_ARM64
GgufQ8Kernels gguf_q8_kernels_neon();
// The SDOT tile (gguf_q8act_neon_dotprod.cpp, compiled for dotprod): call only where cpu_has_dotprod().
void gguf_q8_tile_neon_dotprod(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                               int mt, float* out, const float* lut);
#endif
#ifdef ENGINE_VSX
GgufQ8Kernels gguf_q8_kernels_vsx();
#endif
#ifdef ENGINE_RVV
GgufQ8Kernels gguf_q8_kernels_rvv();
#endif

// The kernels gguf_linear_q8act runs on now (those of gguf_q8act_variant()).
GgufQ8Kernels gguf_q8_kernels();

}  // namespace engine_cpu
