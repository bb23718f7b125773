// AVX2 kernels of the packed Q8-activation GGUF linear: gguf_packed_impl.h on VecAvx2 (8 rows per vector,
// vpmaddubsw + vpmaddwd block dots with x's 4 bytes broadcast).
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "gguf_packed_impl.h"

namespace engine_cpu {
GgufPackedKernels gguf_packed_kernels_avx2() { return packed_kernels<VecAvx2>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
