// AVX-512 VNNI kernels of the packed Q8-activation GGUF linear: gguf_packed_impl.h on VecAvx512Vnni (16 rows per
// vector, vpdpbusd with x's 4 bytes broadcast). Used only where the CPU has AVX512_VNNI (else the AVX2 ones).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see gguf_linear_avx512.cpp
#endif
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512VNNI
#include "gguf_packed_impl.h"

namespace engine_cpu {
GgufPackedKernels gguf_packed_kernels_avx512() { return packed_kernels<VecAvx512Vnni>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
