// The AArch64 Q8-activation tile, shared by gguf_q8act_neon.cpp (plain Advanced SIMD) and
// gguf_q8act_neon_dotprod.cpp (compiled for the dotprod extension): each includes it with its own
// `Dot` (the int8 block dot), so each translation unit's copy is compiled for its own target.
#pragma once

#include "gguf_dequant.h"
#include "gguf_q8act.h"

#ifdef ENGINE_ARM64
#include <arm_neon.h>

namespace engine_cpu {
namespace {

// The 32 weights of a block as two signed 16-byte vectors (elements 0..15, 16..31).
template <int kQ>
inline void load_block(const uint8_t* p, int8x16_t* lo, int8x16_t* hi) {
  if (kQ == kQ8_0) {
    *lo = vld1q_s8(reinterpret_cast<const int8_t*>(p + 2));
    *hi = vld1q_s8(reinterpret_cast<const int8_t*>(p + 18));
  } else {
    const uint8x16_t v = vld1q_u8(p + (kQ == kQ4_1 ? 4 : 2));
    *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
  }
}

// Per (row of x, weight row): four int32 lanes per block, scaled and accumulated in fp32 lanes.
template <int kQ, typename Dot>
void tile_t(const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, int mt, float* out,
            const float* lut) {
  const int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  const int64_t nb = x.k / 32;
  for (int i = 0; i < mt; ++i) {
    const int8_t* xq = x.q + (x0 + i) * x.k;
    const float* xd = x.d + (x0 + i) * nb;
    const float* xs = x.s + (x0 + i) * nb;
    for (int j = 0; j < rows; ++j) {
      const uint8_t* p = w + j * ws;
      float32x4_t acc = vdupq_n_f32(0.0f);
      float macc = 0.0f;
      for (int64_t b = 0; b < nb; ++b, p += bb) {
        int8x16_t lo, hi;
        load_block<kQ>(p, &lo, &hi);
        const float dw = lut[load_fp16(p)];
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(Dot::run(lo, hi, xq + 32 * b)), dw * xd[b]);
        if (kQ == kQ4_1) macc += lut[load_fp16(p + 2)] * xs[b];
        if (kQ == kQ4_0) macc += -8.0f * dw * xs[b];
      }
      out[i * kQ8PanelRows + j] = vaddvq_f32(acc) + macc;
    }
  }
}

template <typename Dot>
void tile(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, int mt, float* out,
          const float* lut) {
  with_qtype(qtype, [&](auto q) { tile_t<decltype(q)::value, Dot>(w, ws, rows, x, x0, mt, out, lut); });
}

}  // namespace

// Defined in gguf_q8act_neon_dotprod.cpp; call only where cpu_has_dotprod().
void gguf_q8_tile_neon_dotprod(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0,
                               int mt, float* out, const float* lut);

}  // namespace engine_cpu
#endif  // ENGINE_ARM64
