// The small ops (rms_norm, rotary, silu_and_mul) for AArch64 NEON (4 lanes):
// rms_norm_impl.h, rotary_impl.h and activation_impl.h on vec.h's VecNeon.
#include "isa.h"

#if defined(ENGINE_ARM64)
#define ENGINE_VEC_FN
#include "activation_impl.h"
#include "rms_norm_impl.h"
#include "rotary_impl.h"

namespace engine_cpu {
void rms_norm_neon(const RmsNormArgs& a) { rms_norm_impl<VecNeon>(a); }
void rotary_row_neon(const RotaryRow& r) { rotary_impl<VecNeon>(r); }
void silu_and_mul_neon(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_impl<VecNeon>(a, r0, r1); }
}  // namespace engine_cpu
#endif  // defined(ENGINE_ARM64)
