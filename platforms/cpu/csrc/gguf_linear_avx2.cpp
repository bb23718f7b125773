// The avx2 fp32-activation GGUF linear kernels: gguf_linear_impl.h on the VecAvx2 backend.
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "gguf_linear_impl.h"

namespace engine_cpu {
GgufLinearKernels gguf_linear_kernels_avx2() { return gguf_kernels<VecAvx2>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
