// The avx512 GGUF dequantize: gguf_dequant_impl.h on the VecAvx512 backend.
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns about the _mm512_undefined_*() seeds of its AVX-512 headers once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512
#include "gguf_dequant_impl.h"
#include "gguf_linear.h"

namespace engine_cpu {
void gguf_dequant_avx512(const DequantArgs& a) { dequant_impl<VecAvx512>(a, fp16_lut()); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
