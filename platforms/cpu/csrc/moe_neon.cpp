// AArch64 NEON (baseline Armv8-A) fused_moe kernels: moe_dot_impl.h's dot on vec.h's VecNeon and the small ops' SiLU-and-mul
// (silu_and_mul_neon); no gemm (every expert takes dot), no separate bf16 widening.
#include "isa.h"

#ifdef ENGINE_ARM64
#define ENGINE_VEC_FN
#include "moe_dot_impl.h"

namespace engine_cpu {
MoeKernels moe_kernels_neon() {
  return {moe_dot<VecNeon, float>, moe_dot<VecNeon, uint16_t>, nullptr, nullptr, silu_and_mul_neon};
}
}  // namespace engine_cpu
#endif  // ENGINE_ARM64
