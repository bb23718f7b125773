// The portable packed fp32-activation GGUF kernels: gguf_packed_f32_impl.h on VecScalar (the reference of the
// layout; the driver uses them only where the scalar ISA is selected).
#include "isa.h"

#define ENGINE_VEC_FN
#include "gguf_packed_f32_impl.h"

namespace engine_cpu {
GgufPackedF32Kernels gguf_packed_f32_kernels_scalar() { return packed_f32_kernels<VecScalar>(); }
}  // namespace engine_cpu
