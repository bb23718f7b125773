// AVX-512 VNNI kernels of the Q8-activation GGUF linear: gguf_q8act_impl.h on VecAvx512Vnni, two blocks
// (64 int8) per vector, vpdpbusd (u8 x s8 -> s32) block dots; each block's d and s stored 8 times, so a
// pair of blocks loads as one vector. The driver uses them only where the CPU has AVX512_VNNI; an AVX-512
// CPU without it runs the AVX2 kernels.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see gguf_linear_avx512.cpp
#endif
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512VNNI
#include "gguf_q8act_impl.h"

namespace engine_cpu {
GgufQ8Kernels gguf_q8_kernels_avx512() { return q8_kernels<VecAvx512Vnni, 8>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
