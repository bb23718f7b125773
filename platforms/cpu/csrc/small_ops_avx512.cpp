// The small ops (rms_norm, rotary, silu_and_mul) for x86 AVX-512 (16 lanes, masked tails):
// rms_norm_impl.h, rotary_impl.h and activation_impl.h on vec.h's VecAvx512.
#include "isa.h"

#if defined(ENGINE_X86)
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX512
#include "activation_impl.h"
#include "rms_norm_impl.h"
#include "rotary_impl.h"

namespace engine_cpu {
void rms_norm_avx512(const RmsNormArgs& a) { rms_norm_impl<VecAvx512>(a); }
void rotary_row_avx512(const RotaryRow& r) { rotary_impl<VecAvx512>(r); }
void silu_and_mul_avx512(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_impl<VecAvx512>(a, r0, r1); }
}  // namespace engine_cpu
#endif  // defined(ENGINE_X86)
