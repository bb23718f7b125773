// GGUF Q4_0 / Q4_1 / Q8_0 and Q4_K / Q5_K / Q6_K rows -> fp32 or bf16 rows. Values are computed in fp32 exactly as the
// format defines them (Q4_1: one multiply then one add, never fused), then rounded to the output.
#pragma once

#include <cstdint>
#include <type_traits>

#include "convert.h"
#include "isa.h"

namespace engine_cpu {

enum GgufType : int { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

// Bytes per 256-element super-block of a K-quant, or 0 for any other qtype.
inline int gguf_kquant_bytes(int qtype) {
  return qtype == kQ4_K ? 144 : qtype == kQ5_K ? 176 : qtype == kQ6_K ? 210 : 0;
}

// Bytes of a row of k columns of qtype (k a multiple of its block), or 0 where qtype is not supported.
int gguf_row_bytes(int qtype, int64_t k);

struct DequantArgs {
  int qtype;
  const uint8_t* src;
  int64_t src_stride;  // bytes between rows
  int64_t rows;
  int64_t cols;        // multiple of 32 (K-quants: of 256)
  void* dst;
  int64_t dst_stride;  // elements between rows
  DType dtype;
};

// f(std::integral_constant<int, kQ>{}) for the block type `qtype`, so a kernel template gets it at compile
// time (anything but Q4_0 / Q4_1 is taken as Q8_0: callers validate qtype first).
template <typename F>
inline void with_qtype(int qtype, F&& f) {
  switch (qtype) {
    case kQ4_0: return f(std::integral_constant<int, kQ4_0>{});
    case kQ4_1: return f(std::integral_constant<int, kQ4_1>{});
    default: return f(std::integral_constant<int, kQ8_0>{});
  }
}

// Bytes per 32-element block, or 0 for an unsupported qtype.
int gguf_block_bytes(int qtype);
// Validates and dispatches to the current ISA; throws std::invalid_argument on bad arguments.
void gguf_dequant(const DequantArgs& a);

// K-quant rows through the current ISA's super-block decode (gguf_kquant_impl.h; gguf_linear.cpp).
void gguf_kquant_dequant(const DequantArgs& a);

// The per-ISA kernels (gguf_dequant_impl.h on each backend), arguments already validated.
void gguf_dequant_scalar(const DequantArgs& a);
#ifdef ENGINE_X86
void gguf_dequant_avx2(const DequantArgs& a);
void gguf_dequant_avx512(const DequantArgs& a);
#endif
#ifdef ENGINE_ARM64
void gguf_dequant_neon(const DequantArgs& a);
#endif
#ifdef ENGINE_VSX
void gguf_dequant_vsx(const DequantArgs& a);
#endif

}  // namespace engine_cpu
