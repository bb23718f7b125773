// silu_and_mul: out[r, i] = silu(x[r, i]) * x[r, d + i] for rows of 2*d (gate then up), fp32 math,
// fp32, bf16 or fp16 storage (x and out share it), one rounding at the end.
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

// Rows [r0, r1) on one thread, one variant per ISA: activation_impl.h instantiated by small_ops_<isa>.cpp.
void silu_and_mul_scalar(const SiluMulArgs& a, int64_t r0, int64_t r1);
#ifdef ENGINE_X86
void silu_and_mul_avx2(const SiluMulArgs& a, int64_t r0, int64_t r1);
void silu_and_mul_avx512(const SiluMulArgs& a, int64_t r0, int64_t r1);
#endif
#ifdef ENGINE_ARM64
void silu_and_mul_neon(const SiluMulArgs& a, int64_t r0, int64_t r1);
#endif
#ifdef ENGINE_VSX
void silu_and_mul_vsx(const SiluMulArgs& a, int64_t r0, int64_t r1);
#endif
#ifdef ENGINE_RVV
void silu_and_mul_rvv(const SiluMulArgs& a, int64_t r0, int64_t r1);
#endif

}  // namespace engine_cpu
