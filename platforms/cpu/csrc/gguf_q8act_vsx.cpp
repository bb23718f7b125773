// The POWER (VSX) Q8-activation GGUF kernels: gguf_q8act_impl.h on VecVsx, the block dots by vmsummbm
// (signed x unsigned bytes into int32 lanes).
#include "isa.h"

#ifdef ENGINE_VSX
#define ENGINE_VEC_FN
#include "gguf_q8act_impl.h"

namespace engine_cpu {
GgufQ8Kernels gguf_q8_kernels_vsx() { return q8_kernels<VecVsx, 1>(); }
}  // namespace engine_cpu
#endif  // ENGINE_VSX
