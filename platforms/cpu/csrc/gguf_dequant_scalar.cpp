// The scalar GGUF dequantize: gguf_dequant_impl.h on the VecScalar backend.
#include "isa.h"

#define ENGINE_VEC_FN
#include "gguf_dequant_impl.h"
#include "gguf_linear.h"

namespace engine_cpu {
void gguf_dequant_scalar(const DequantArgs& a) { dequant_impl<VecScalar>(a, fp16_lut()); }
}  // namespace engine_cpu
