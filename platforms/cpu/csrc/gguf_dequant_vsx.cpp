// The vsx GGUF dequantize: gguf_dequant_impl.h on the VecVsx backend.
#include "isa.h"

#ifdef ENGINE_VSX
#define ENGINE_VEC_FN
#include "gguf_dequant_impl.h"
#include "gguf_linear.h"

namespace engine_cpu {
void gguf_dequant_vsx(const DequantArgs& a) { dequant_impl<VecVsx>(a, fp16_lut()); }
}  // namespace engine_cpu
#endif  // ENGINE_VSX
