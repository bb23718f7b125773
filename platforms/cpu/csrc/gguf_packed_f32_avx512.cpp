// AVX-512 kernels of the packed fp32-activation GGUF linear: gguf_packed_f32_impl.h on VecAvx512 (16 rows per
// vector, a Q4 nibble to fp32 in one vpermps). AVX-512F/BW/VL/DQ suffice (no VNNI: no integer dots here).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see gguf_linear_avx512.cpp
#endif
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512
#include "gguf_packed_f32_impl.h"

namespace engine_cpu {
GgufPackedF32Kernels gguf_packed_f32_kernels_avx512() { return packed_f32_kernels<VecAvx512>(); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
