// The portable packed Q8-activation GGUF kernels: gguf_packed_impl.h on VecScalar (the reference of the layout;
// the driver uses them only where the scalar ISA is selected).
#include "isa.h"

#define ENGINE_VEC_FN
#include "gguf_packed_impl.h"

namespace engine_cpu {
GgufPackedKernels gguf_packed_kernels_scalar() { return packed_kernels<VecScalar>(); }
}  // namespace engine_cpu
