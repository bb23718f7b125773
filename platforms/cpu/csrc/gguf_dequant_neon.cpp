// The neon GGUF dequantize: gguf_dequant_impl.h on the VecNeon backend.
#include "isa.h"

#ifdef ENGINE_ARM64
#define ENGINE_VEC_FN
#include "gguf_dequant_impl.h"
#include "gguf_linear.h"

namespace engine_cpu {
void gguf_dequant_neon(const DequantArgs& a) { dequant_impl<VecNeon>(a, fp16_lut()); }
}  // namespace engine_cpu
#endif  // ENGINE_ARM64
