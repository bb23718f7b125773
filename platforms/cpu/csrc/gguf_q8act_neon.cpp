// AArch64 kernels of the Q8-activation GGUF linear: SDOT (Armv8.2 dotprod) block dots where the CPU has
// them, widening multiply-accumulates (SMULL/SADALP) on plain Advanced SIMD otherwise. Weights are
// used as signed bytes: Q4 nibbles (0..15) fit, Q8_0 is int8 already.
#include <algorithm>
#include <cmath>

#include "gguf_q8act_neon.h"

#ifdef ENGINE_ARM64

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

struct DotWiden {
  static inline int32x4_t run(int8x16_t wlo, int8x16_t whi, const int8_t* xq) {
    const int8x16_t xlo = vld1q_s8(xq), xhi = vld1q_s8(xq + 16);
    int32x4_t acc = vpaddlq_s16(vmull_s8(vget_low_s8(wlo), vget_low_s8(xlo)));
    acc = vpadalq_s16(acc, vmull_high_s8(wlo, xlo));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(whi), vget_low_s8(xhi)));
    return vpadalq_s16(acc, vmull_high_s8(whi, xhi));
  }
};

}  // namespace

GgufQ8Kernels gguf_q8_kernels_neon() {
  return {1, 4, quantize, cpu_has_dotprod() ? gguf_q8_tile_neon_dotprod : tile<DotWiden>};
}

}  // namespace engine_cpu
#endif  // ENGINE_ARM64
