// silu_and_mul: out[r, i] = silu(x[r, i]) * x[r, d + i] for rows of 2*d (gate then up), fp32 math,
// fp32 or bf16 storage (x and out share it), one rounding at the end.
#pragma once

#include <cstdint>

#include "convert.h"
#include "isa.h"

namespace engine_cpu {

struct SiluMulArgs {
  const void* x;
  int64_t x_stride;  // elements between rows
  void* out;
  int64_t out_stride;
  int64_t rows, d;
  DType dtype;
};

// Validates, then splits the rows over the thread pool and runs the current ISA's variant.
void silu_and_mul(const SiluMulArgs& a);

// Rows [r0, r1) on one thread (the scalar variant: columns [col0, d) only).
void silu_and_mul_scalar(const SiluMulArgs& a, int64_t r0, int64_t r1, int64_t col0 = 0);
#ifdef ENGINE_X86
void silu_and_mul_avx2(const SiluMulArgs& a, int64_t r0, int64_t r1);
void silu_and_mul_avx512(const SiluMulArgs& a, int64_t r0, int64_t r1);
#endif

}  // namespace engine_cpu
