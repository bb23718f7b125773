// The avx2 GGUF dequantize: gguf_dequant_impl.h on the VecAvx2 backend.
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "gguf_dequant_impl.h"
#include "gguf_linear.h"

namespace engine_cpu {
void gguf_dequant_avx2(const DequantArgs& a) { dequant_impl<VecAvx2>(a, fp16_lut()); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
