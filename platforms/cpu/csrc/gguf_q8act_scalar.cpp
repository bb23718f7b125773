// The portable Q8-activation GGUF kernels: gguf_q8act_impl.h on VecScalar (one scale per block).
#include "isa.h"

#define ENGINE_VEC_FN
#include "gguf_q8act_impl.h"

namespace engine_cpu {
GgufQ8Kernels gguf_q8_kernels_scalar() { return q8_kernels<VecScalar, 1>(); }
}  // namespace engine_cpu
