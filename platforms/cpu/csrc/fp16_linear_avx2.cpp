// The avx2 fp16 linear panel: fp16_linear_impl.h on the VecAvx2 backend.
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "fp16_linear_impl.h"

namespace engine_cpu {
void fp16_panel_avx2(const float* x, int64_t xs, int64_t m, const uint16_t* w, int64_t ws, int rows, int64_t k,
                     float* out) {
  fp16_panel_impl<VecAvx2>(x, xs, m, w, ws, rows, k, out);
}
}  // namespace engine_cpu
#endif  // ENGINE_X86
