// RMSNorm over rows of `hidden` elements, fp32 math, fp32, bf16 or fp16 storage (x, residual, weight and
// outputs share the dtype). With a residual it is the fused variant:
//   s = round_to_dtype(x + residual); out = rms_norm(s); sum_out = s.
// out = (s * r) * w with r = 1 / sqrt(sum(s^2) / hidden + eps), the same operation order as the
// torch reference, so only the order of the sum of squares differs.
#pragma once

#include <cstdint>

#include "convert.h"
#include "isa.h"

namespace engine_cpu {

struct RmsNormArgs {
  const void* x;
  int64_t x_stride;     // elements between rows
  const void* res;      // nullptr: plain RMSNorm
  int64_t res_stride;
  const void* w;        // [hidden], contiguous
  void* out;
  int64_t out_stride;
  void* sum_out;        // fused only: receives s
  int64_t sum_stride;
  int64_t rows;
  int64_t hidden;
  float eps;
  DType dtype;
};

// Validates and dispatches to the current ISA; throws std::invalid_argument on bad arguments.
void rms_norm(const RmsNormArgs& a);

// One variant per ISA: rms_norm_impl.h instantiated by small_ops_<isa>.cpp.
void rms_norm_scalar(const RmsNormArgs& a);
#ifdef ENGINE_X86
void rms_norm_avx2(const RmsNormArgs& a);
void rms_norm_avx512(const RmsNormArgs& a);
#endif
#ifdef ENGINE_ARM64
void rms_norm_neon(const RmsNormArgs& a);
#endif
#ifdef ENGINE_VSX
void rms_norm_vsx(const RmsNormArgs& a);
#endif
#ifdef ENGINE_RVV
void rms_norm_rvv(const RmsNormArgs& a);
#endif

}  // namespace engine_cpu
