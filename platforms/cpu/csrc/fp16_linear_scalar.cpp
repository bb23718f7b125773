// The scalar fp16 linear panel: fp16_linear_impl.h on the VecScalar backend.
#include "isa.h"

#define ENGINE_VEC_FN 
#include "fp16_linear_impl.h"

namespace engine_cpu {
void fp16_panel_scalar(const float* x, int64_t xs, int64_t m, const uint16_t* w, int64_t ws, int rows, int64_t k,
                       float* out) {
  fp16_panel_impl<VecScalar>(x, xs, m, w, ws, rows, k, out);
}
}  // namespace engine_cpu
