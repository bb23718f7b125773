// The avx512 fp32-activation GGUF linear kernels: gguf_linear_impl.h on the VecAvx512 backend.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns about the _mm512_undefined_*() seeds of its AVX-512 headers once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512
#include "gguf_linear_impl.h"

namespace engine_cpu {
GgufLinearKernels gguf_linear_kernels_avx512() { return gguf_kernels<VecAvx512>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
