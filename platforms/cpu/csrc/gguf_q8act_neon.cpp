// AArch64 kernels of the Q8-activation GGUF linear: the NEON quantizer, and gguf_q8act_impl.h's tile with
// SDOT (Armv8.2 dotprod, gguf_q8act_neon_dotprod.cpp) block dots where the CPU has them, widening
// multiply-accumulates (SMULL/SADALP, Q8Ops<VecNeon>) on plain Advanced SIMD otherwise. Weights are used
// as signed bytes: Q4 nibbles (0..15) fit, Q8_0 is int8 already.
#include "isa.h"

#ifdef ENGINE_ARM64
#define ENGINE_VEC_FN
#include "gguf_q8act_impl.h"

namespace engine_cpu {
namespace {

void quantize(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + 32 * b;
    float32x4_t v[8], m = vdupq_n_f32(0.0f);
    for (int u = 0; u < 8; ++u) {
      v[u] = vld1q_f32(xb + 4 * u);
      m = vmaxq_f32(m, vabsq_f32(v[u]));
    }
    const float db = vmaxvq_f32(m) / 127.0f;
    const float32x4_t inv = vdupq_n_f32(db > 0.0f ? 1.0f / db : 0.0f);
    int32x4_t sum = vdupq_n_s32(0);
    for (int u = 0; u < 8; u += 2) {
      // vcvtnq rounds to nearest with ties to even, as torch.round.
      const int32x4_t a = vcvtnq_s32_f32(vmulq_f32(v[u], inv)), c = vcvtnq_s32_f32(vmulq_f32(v[u + 1], inv));
      sum = vaddq_s32(sum, vaddq_s32(a, c));
      const int16x8_t h = vcombine_s16(vqmovn_s32(a), vqmovn_s32(c));
      vst1_s8(q + 32 * b + 4 * u, vqmovn_s16(h));
    }
    d[b] = db;
    s[b] = db * static_cast<float>(vaddvq_s32(sum));
  }
}

}  // namespace

GgufQ8Kernels gguf_q8_kernels_neon() {
  return {1, kQ8TileRows<VecNeon>, quantize,
          cpu_has_dotprod() ? gguf_q8_tile_neon_dotprod : q8_tile_impl<VecNeon, Q8Ops<VecNeon>, 1>};
}

}  // namespace engine_cpu
#endif  // ENGINE_ARM64
