// AVX2 kernels of the packed fp32-activation GGUF linear: gguf_packed_f32_impl.h on VecAvx2 (8 rows per vector,
// two vectors per 16-row group; a value is shift, mask or shifts, convert).
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "gguf_packed_f32_impl.h"

namespace engine_cpu {
GgufPackedF32Kernels gguf_packed_f32_kernels_avx2() { return packed_f32_kernels<VecAvx2>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
