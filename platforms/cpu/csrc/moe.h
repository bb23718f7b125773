// fused_moe: softmax top-k routing and SwiGLU experts in one call (the contract of core/ops/moe.py):
//   (weights, ids) = route(logits): fp32 softmax over the experts, the top_k largest kept (descending,
//                    equal values: the lower expert id first), optionally renormalised to sum 1;
//   expert_e(x)    = w2[e] @ (silu(w13[e, :I] @ x) * (w13[e, I:] @ x));
//   out[t]         = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]), fp32, rounded once to dtype.
//
// Structure. Tokens are taken in chunks (kMoeChunkPairs (token, slot) pairs at most, bounding the
// scratch memory); per chunk: route, group the pairs by expert (ascending token order inside an
// expert), gather each expert's M rows of x as fp32, then three threaded phases:
//  1. work items (expert, tile of kMoeTile intermediate rows): the expert's rows of x times its gate
//     and up rows of the tile, then SiLU-and-mul into h (fp32);
//  2. work items (expert, tile of kMoeTile output rows): h times the expert's w2 rows of the tile,
//     scaled by each pair's routing weight, into y [pairs, hidden] (fp32). Expert-major items keep an
//     expert's activations in cache while its weights stream by, and no two items write one value;
//  3. per token: out = the sum of its top_k rows of y in ascending expert order (the reference's
//     order), rounded once.
// Every weight row is read once per chunk. Two inner kernels, chosen per expert by its row count M:
//  * M < kMoeGemmMinM (kMoeGemmMinMBf16 for bf16; decode, small batches): `dot` multiplies up to
//    kMoeMaxMt rows of x by kMoePanel weight rows, reducing along k in vector lanes (weights in their
//    storage dtype, bf16 widened in registers);
//  * larger M: the expert's activations are transposed ([k, M] padded to 16 columns, x^T and h^T),
//    and `gemm` broadcasts one weight value against vectors of 16 tokens: no reduction across lanes
//    and one cache line of weights serves 16 steps: up to 1.5x the throughput of `dot` (fp32, 64 rows
//    per expert; bf16 weight rows are widened once per work item into an fp32 buffer, which costs
//    part of that gain). AVX-512 only: an AVX2 version measured slower than dot.
// Products and sums are fp32 throughout; only the order of the sums differs from the reference.
#pragma once

#include <cstdint>

#include "activation.h"
#include "convert.h"
#include "isa.h"

namespace engine_cpu {

struct MoeArgs {
  const void* x;  // [tokens, hidden] of dtype, unit stride along hidden
  int64_t x_stride;
  const void* w13;  // [experts, 2*inter, hidden] of dtype (gate rows then up rows), unit last stride
  int64_t w13_expert_stride, w13_row_stride;
  const void* w2;  // [experts, hidden, inter] of dtype, unit last stride
  int64_t w2_expert_stride, w2_row_stride;
  const void* logits;  // [tokens, experts] of logits_dtype, unit last stride
  int64_t logits_stride;
  DType logits_dtype;
  void* out;  // [tokens, hidden] of dtype, unit last stride; must not overlap the inputs
  int64_t out_stride;
  int64_t tokens, hidden, inter, experts;
  int top_k;
  bool renormalize;
  DType dtype;  // of x, w13, w2 and out
};

// Validates (std::invalid_argument) and runs on the current ISA over the thread pool. All strides
// are in elements.
void fused_moe(const MoeArgs& a);

// The routing step alone, rows [0, tokens): weights [tokens, top_k] and ids [tokens, top_k].
void moe_route(const void* logits, int64_t logits_stride, DType logits_dtype, int64_t tokens, int64_t experts,
               int top_k, bool renormalize, float* weights, int64_t* ids);

constexpr int kMoePanel = 4;         // weight rows per kernel call
constexpr int kMoeMaxMt = 6;         // activation rows per kernel call
constexpr int64_t kMoeTile = 16;     // weight rows (intermediate or output) per work item
constexpr int64_t kMoeChunkPairs = 1024;

constexpr int kMoeGemmRows = 8;      // weight rows per gemm call
// Rows of an expert from which gemm beats dot (AVX-512, measured); bf16 later, as its weight rows are
// widened into a buffer first.
constexpr int64_t kMoeGemmMinM = 12;
constexpr int64_t kMoeGemmMinMBf16 = 24;

// Per-ISA building blocks.
//  dot:  out[i * kMoePanel + j] = sum_{c < k} x[i * x_stride + c] * w[j][c] for i < mt (1..kMoeMaxMt),
//        j < kMoePanel; W is float (fp32) or uint16_t (bf16 bits).
//  gemm: optional (nullptr: dot for every M): out[j * ldo + m] = sum_{c < k} w[j][c] * xt[c * ldx + m]
//        for j < kMoeGemmRows, m < mpad (a multiple of 16).
//  widen: dst[i] = bf16 src[i] as fp32, i < n.
//  silu_mul: as silu_and_mul's per-thread variants (fp32 rows here).
struct MoeKernels {
  void (*dot_f32)(const float* x, int64_t x_stride, int mt, const float* const* w, int64_t k, float* out);
  void (*dot_bf16)(const float* x, int64_t x_stride, int mt, const uint16_t* const* w, int64_t k, float* out);
  void (*gemm)(const float* xt, int64_t ldx, int64_t mpad, const float* const* w, int64_t k, float* out,
               int64_t ldo);
  void (*widen)(const uint16_t* src, float* dst, int64_t n);
  void (*silu_mul)(const SiluMulArgs& a, int64_t r0, int64_t r1);
};

MoeKernels moe_kernels_scalar();
#ifdef ENGINE_X86
MoeKernels moe_kernels_avx2();
MoeKernels moe_kernels_avx512();
#endif
#ifdef ENGINE_ARM64
MoeKernels moe_kernels_neon();
#endif
#ifdef ENGINE_VSX
MoeKernels moe_kernels_vsx();
#endif
#ifdef ENGINE_RVV
MoeKernels moe_kernels_rvv();
#endif

}  // namespace engine_cpu
