// AArch64 kernels of the Q8-activation GGUF linear: gguf_q8act_impl.h on VecNeon (widening
// multiply-accumulates, SMULL/SADALP), or on VecNeonDot (SDOT, gguf_q8act_neon_dotprod.cpp) where the CPU has
// Armv8.2 dotprod. Weights are used as signed bytes: Q4 nibbles (0..15) fit, Q8_0 is int8 already.
#include "isa.h"

#ifdef ENGINE_ARM64
#define ENGINE_VEC_FN
#include "gguf_q8act_impl.h"

namespace engine_cpu {
GgufQ8Kernels gguf_q8_kernels_neon() {
  GgufQ8Kernels k = q8_kernels<VecNeon, 1>();
  if (cpu_has_dotprod()) k.tile = gguf_q8_tile_neon_dotprod;
  return k;
}
}  // namespace engine_cpu
#endif  // ENGINE_ARM64
