// POWER VSX fused_moe kernels: moe_dot_impl.h's dot on vec.h's VecVsx and the small ops' SiLU-and-mul
// (silu_and_mul_vsx); no gemm (every expert takes dot), no separate bf16 widening.
#include "isa.h"

#ifdef ENGINE_VSX
#define ENGINE_VEC_FN
#include "moe_dot_impl.h"

namespace engine_cpu {
MoeKernels moe_kernels_vsx() {
  return {moe_dot<VecVsx, float>, moe_dot<VecVsx, uint16_t>, nullptr, nullptr, silu_and_mul_vsx};
}
}  // namespace engine_cpu
#endif  // ENGINE_VSX
