// The small ops (rms_norm, rotary, silu_and_mul) for x86 AVX2 (8 lanes):
// rms_norm_impl.h, rotary_impl.h and activation_impl.h on vec.h's VecAvx2.
#include "isa.h"

#if defined(ENGINE_X86)
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "activation_impl.h"
#include "rms_norm_impl.h"
#include "rotary_impl.h"

namespace engine_cpu {
void rms_norm_avx2(const RmsNormArgs& a) { rms_norm_impl<VecAvx2>(a); }
void rotary_row_avx2(const RotaryRow& r) { rotary_impl<VecAvx2>(r); }
void silu_and_mul_avx2(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_impl<VecAvx2>(a, r0, r1); }
}  // namespace engine_cpu
#endif  // defined(ENGINE_X86)
