// The dotprod (SDOT) variant of the AArch64 Q8-activation tile: gguf_q8act_impl.h on VecNeonDot, this whole
// file compiled for Armv8.2 dotprod; the driver calls it only where cpu_has_dotprod() says so.
#include "isa.h"

#ifdef ENGINE_ARM64
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif
#define ENGINE_VEC_FN
#include "gguf_q8act_impl.h"

namespace engine_cpu {
void gguf_q8_tile_neon_dotprod(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                               int mt, float* out, const float* lut) {
  q8_tile_impl<VecNeonDot, 1>(qtype, w, ws, rows, x, x0, mt, out, lut);
}
}  // namespace engine_cpu
#if defined(__clang__)
#pragma clang attribute pop
#endif
#endif  // ENGINE_ARM64
