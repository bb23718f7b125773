// The portable Q8-activation GGUF kernels: the lanes = 1 quantizer and gguf_q8act_impl.h on VecScalar.
#include "isa.h"

#define ENGINE_VEC_FN
#include "gguf_q8act_impl.h"

namespace engine_cpu {
GgufQ8Kernels gguf_q8_kernels_scalar() {
  return {1, kQ8TileRows<VecScalar>, quantize_q8_rows, q8_tile_impl<VecScalar, Q8Ops<VecScalar>, 1>};
}
}  // namespace engine_cpu
