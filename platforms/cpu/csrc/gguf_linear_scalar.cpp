// The scalar fp32-activation GGUF linear kernels: gguf_linear_impl.h on the VecScalar backend.
#include "isa.h"

#define ENGINE_VEC_FN
#include "gguf_linear_impl.h"

namespace engine_cpu {
GgufLinearKernels gguf_linear_kernels_scalar() { return gguf_kernels<VecScalar>(); }
}  // namespace engine_cpu

