// The small ops (rms_norm, rotary, silu_and_mul) for POWER VSX (4 lanes; fp16 via xvcvhpsp/xvcvsphp):
// rms_norm_impl.h, rotary_impl.h and activation_impl.h on vec.h's VecVsx.
#include "isa.h"

#if defined(ENGINE_VSX)
#define ENGINE_VEC_FN
#include "activation_impl.h"
#include "rms_norm_impl.h"
#include "rotary_impl.h"

namespace engine_cpu {
void rms_norm_vsx(const RmsNormArgs& a) { rms_norm_impl<VecVsx>(a); }
void rotary_row_vsx(const RotaryRow& r) { rotary_impl<VecVsx>(r); }
void silu_and_mul_vsx(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_impl<VecVsx>(a, r0, r1); }
}  // namespace engine_cpu
#endif  // defined(ENGINE_VSX)
