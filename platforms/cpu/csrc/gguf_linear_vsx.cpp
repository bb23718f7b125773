// The vsx fp32-activation GGUF linear kernels: gguf_linear_impl.h on the VecVsx backend.
#include "isa.h"

#ifdef ENGINE_VSX
#define ENGINE_VEC_FN 
#include "gguf_linear_impl.h"

namespace engine_cpu {
GgufLinearKernels gguf_linear_kernels_vsx() { return gguf_kernels<VecVsx>(); }
}  // namespace engine_cpu
#endif  // ENGINE_VSX
