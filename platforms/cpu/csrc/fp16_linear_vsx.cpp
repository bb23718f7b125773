// The vsx fp16 linear panel: fp16_linear_impl.h on the VecVsx backend.
#include "isa.h"

#ifdef ENGINE_VSX
#define ENGINE_VEC_FN 
#include "fp16_linear_impl.h"

namespace engine_cpu {
void fp16_panel_vsx(const float* x, int64_t xs, int64_t m, const uint16_t* w, int64_t ws, int rows, int64_t k,
                    float* out) {
  fp16_panel_impl<VecVsx>(x, xs, m, w, ws, rows, k, out);
}
}  // namespace engine_cpu
#endif  // ENGINE_VSX
