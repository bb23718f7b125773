// AArch64 NEON fused_moe kernels (baseline Armv8-A: 4 fp32 lanes, FMA); bf16 weights widen with a
// 16-bit shift. The last k % 4 columns run in scalar code; SiLU-and-mul uses the scalar variant.
#include "moe.h"

#ifdef ENGINE_ARM64
#include <arm_neon.h>

namespace engine_cpu {
namespace {

inline float32x4_t load(const float* p) { return vld1q_f32(p); }
inline float32x4_t load(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

// {sum(a), sum(b), sum(c), sum(d)}.
inline float32x4_t hsum4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
  return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
}

// MT rows of x times 4 weight rows: MT * 4 accumulators (<= 24) + 4 weight vectors + 1 x vector fit
// the 32 registers; U accumulator sets for small MT (FMA latency).
template <typename W, int MT, int U>
void dot_t(const float* x, int64_t xs, const W* const* w, int64_t k, float* out) {
  const W *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  float32x4_t acc[U][MT][4];
  for (int u = 0; u < U; ++u)
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < 4; ++j) acc[u][i][j] = vdupq_n_f32(0.0f);
  const int64_t body = k / (4 * U) * (4 * U);
  for (int64_t c = 0; c < body; c += 4 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 4 * u;
      const float32x4_t v0 = load(w0 + cc), v1 = load(w1 + cc), v2 = load(w2 + cc), v3 = load(w3 + cc);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const float32x4_t xv = vld1q_f32(x + i * xs + cc);
        acc[u][i][0] = vfmaq_f32(acc[u][i][0], v0, xv);
        acc[u][i][1] = vfmaq_f32(acc[u][i][1], v1, xv);
        acc[u][i][2] = vfmaq_f32(acc[u][i][2], v2, xv);
        acc[u][i][3] = vfmaq_f32(acc[u][i][3], v3, xv);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    for (int u = 1; u < U; ++u)
      for (int j = 0; j < 4; ++j) acc[0][i][j] = vaddq_f32(acc[0][i][j], acc[u][i][j]);
    vst1q_f32(out + i * 4, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
    for (int j = 0; j < 4; ++j) {
      float tail = 0.0f;
      for (int64_t c = body; c < k; ++c) tail += x[i * xs + c] * to_f32(w[j][c]);
      out[i * 4 + j] += tail;
    }
  }
}

template <typename W>
void dot(const float* x, int64_t xs, int mt, const W* const* w, int64_t k, float* out) {
  static_assert(kMoePanel == 4 && kMoeMaxMt == 6, "the kernels are written for 4 x (1..6)");
  switch (mt) {
    case 1: return dot_t<W, 1, 2>(x, xs, w, k, out);
    case 2: return dot_t<W, 2, 2>(x, xs, w, k, out);
    case 3: return dot_t<W, 3, 1>(x, xs, w, k, out);
    case 4: return dot_t<W, 4, 1>(x, xs, w, k, out);
    case 5: return dot_t<W, 5, 1>(x, xs, w, k, out);
    default: return dot_t<W, 6, 1>(x, xs, w, k, out);
  }
}

void silu_mul(const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_scalar(a, r0, r1); }

}  // namespace

MoeKernels moe_kernels_neon() { return {dot<float>, dot<uint16_t>, nullptr, nullptr, silu_mul}; }

}  // namespace engine_cpu
#endif  // ENGINE_ARM64
