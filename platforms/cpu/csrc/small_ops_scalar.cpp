// The small ops (rms_norm, rotary, silu_and_mul) on the portable path (hosts without a vector backend
// and the forced `scalar` ISA): rms_norm_impl.h, rotary_impl.h and activation_impl.h on VecScalar.
#define ENGINE_VEC_FN
#include "activation_impl.h"
#include "rms_norm_impl.h"
#include "rotary_impl.h"

namespace engine_cpu {
void rms_norm_scalar(const RmsNormArgs& a) { rms_norm_impl<VecScalar>(a); }
void rotary_row_scalar(const RotaryRow& r) { rotary_impl<VecScalar>(r); }
void silu_and_mul_scalar(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_impl<VecScalar>(a, r0, r1); }
}  // namespace engine_cpu
