// AVX-512 fused_moe kernels: moe_dot_impl.h's dot (weight prefetch, masked tails), gemm (experts with
// many rows) and bf16 widening on vec.h's VecAvx512, and the small ops' SiLU-and-mul.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers seed results with _mm512_undefined_*() and then warn about it once the
// intrinsics are inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512
#include "moe_dot_impl.h"

namespace engine_cpu {
MoeKernels moe_kernels_avx512() {
  return {moe_dot<VecAvx512, float, true>, moe_dot<VecAvx512, uint16_t, true>, moe_gemm<VecAvx512>,
          moe_widen<VecAvx512>, silu_and_mul_avx512};
}
}  // namespace engine_cpu
#endif  // ENGINE_X86
