// AVX2 kernels of the Q8-activation GGUF linear: gguf_q8act_impl.h on VecAvx2, one block (32 int8) per
// vector, vpmaddubsw + vpmaddwd block dots; each block's d and s stored 8 times (one vector load).
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "gguf_q8act_impl.h"

namespace engine_cpu {
GgufQ8Kernels gguf_q8_kernels_avx2() { return q8_kernels<VecAvx2, 8>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
