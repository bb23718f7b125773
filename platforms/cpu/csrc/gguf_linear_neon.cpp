// The neon fp32-activation GGUF linear kernels: gguf_linear_impl.h on the VecNeon backend.
#include "isa.h"

#ifdef ENGINE_ARM64
#define ENGINE_VEC_FN 
#include "gguf_linear_impl.h"

namespace engine_cpu {
GgufLinearKernels gguf_linear_kernels_neon() { return gguf_kernels<VecNeon>(); }
}  // namespace engine_cpu
#endif  // ENGINE_ARM64
