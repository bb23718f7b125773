// The small ops (rms_norm, rotary, silu_and_mul) for RISC-V V 1.0 (length agnostic, VLEN/16 lanes):
// rms_norm_impl.h, rotary_impl.h and activation_impl.h on vec.h's VecRvv.
#include "isa.h"

#if defined(ENGINE_RVV)
#define ENGINE_VEC_FN
#include "activation_impl.h"
#include "rms_norm_impl.h"
#include "rotary_impl.h"

namespace engine_cpu {
void rms_norm_rvv(const RmsNormArgs& a) { rms_norm_impl<VecRvv>(a); }
void rotary_row_rvv(const RotaryRow& r) { rotary_impl<VecRvv>(r); }
void silu_and_mul_rvv(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_impl<VecRvv>(a, r0, r1); }
}  // namespace engine_cpu
#endif  // defined(ENGINE_RVV)
