// RISC-V V 1.0 at 128-bit vectors fused_moe kernels: moe_dot_impl.h's dot on vec.h's VecRvv128 and the small ops' SiLU-and-mul
// (silu_and_mul_rvv); no gemm (every expert takes dot), no separate bf16 widening.
#include "isa.h"

#ifdef ENGINE_RVV
#define ENGINE_VEC_FN
#include "moe_dot_impl.h"

namespace engine_cpu {
MoeKernels moe_kernels_rvv() {
  return {moe_dot<VecRvv128, float>, moe_dot<VecRvv128, uint16_t>, nullptr, nullptr, silu_and_mul_rvv};
}
}  // namespace engine_cpu
#endif  // ENGINE_RVV
