// AVX2 fused_moe kernels: moe_dot_impl.h's dot on vec.h's VecAvx2 (16 registers: at most 3 rows of x
// per pass, weight prefetch) and the small ops' SiLU-and-mul.
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "moe_dot_impl.h"

namespace engine_cpu {
// No gemm: an 8-lane broadcast kernel (4 rows x 16 tokens) measured 10-20% slower than dot at 64-256
// tokens, so AVX2 runs dot for every M.
MoeKernels moe_kernels_avx2() {
  return {moe_dot<VecAvx2, float, true>, moe_dot<VecAvx2, uint16_t, true>, nullptr, nullptr, silu_and_mul_avx2};
}
}  // namespace engine_cpu
#endif  // ENGINE_X86
