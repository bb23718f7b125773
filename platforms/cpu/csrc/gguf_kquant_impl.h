// GGUF K-quant super-block decode (Q4_K, Q5_K, Q6_K: 256 elements each; layouts in engine/core/ops/gguf_kquants.py)
// into fp32 rows, for gguf_linear's weight panels and gguf_dequant. Plain loops of 32 (or 16) lanes over bytes that
// the compiler vectorizes for the including translation unit's target (gguf_linear_impl.h on each backend, which
// defines ENGINE_VEC_FN first); the per-sub-block scale and offset are computed once in fp32.
//
// Values are the reference's bit for bit: (d * sc) * q - (dmin * m) (Q4_K, Q5_K) and (d * sc) * (q - 32) (Q6_K),
// products and difference each rounded (the build has no FMA contraction).
#pragma once

#include <cstdint>
#include <cstring>

#include "convert.h"
#include "gguf_dequant.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including gguf_kquant_impl.h"
#endif

namespace engine_cpu {
namespace {

// The 8 six-bit scales and mins of the 12 bytes at s (llama.cpp's get_scale_min_k4), unpacked 4 at a time in 32-bit
// words (scales 0-3 are the low 6 bits of bytes 0-3, mins 0-3 of bytes 4-7; scales and mins 4-7 take the low and
// high nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 and 4-7): ~12 integer ops instead of ~50 byte by byte,
// which mattered beside the vector work of a 256-element super-block in the decode GEMV.
ENGINE_VEC_FN inline void scale_min_k4(const uint8_t* s, float d, float dmin, float* a, float* c) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (int j = 0; j < 8; ++j) {  // byte by byte: the word trick below reads bytes in little-endian order
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    a[j] = d * static_cast<float>(sc);
    c[j] = dmin * static_cast<float>(mn);
  }
#else
  uint32_t w[3];
  std::memcpy(w, s, 12);
  constexpr uint32_t k6 = 0x3f3f3f3fu, k4 = 0x0f0f0f0fu, k2 = 0x03030303u;
  const uint32_t sc[2] = {w[0] & k6, (w[2] & k4) | (((w[0] >> 6) & k2) << 4)};
  const uint32_t mn[2] = {w[1] & k6, ((w[2] >> 4) & k4) | (((w[1] >> 6) & k2) << 4)};
  uint8_t scb[8], mnb[8];
  std::memcpy(scb, sc, 8);
  std::memcpy(mnb, mn, 8);
  for (int j = 0; j < 8; ++j) {
    a[j] = d * static_cast<float>(scb[j]);
    c[j] = dmin * static_cast<float>(mnb[j]);
  }
#endif
}

// Q4_K (kFive false) or Q5_K: 4 groups of 64, each the low then the high nibbles of 32 bytes (+ a fifth bit).
template <bool kFive>
ENGINE_VEC_FN inline void decode_q45k(const uint8_t* b, float* o) {
  float a[8], c[8];
  scale_min_k4(b + 4, fp16_to_f32(load_fp16(b)), fp16_to_f32(load_fp16(b + 2)), a, c);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (kFive ? 48 : 16);
  for (int g = 0; g < 4; ++g) {
    const float a0 = a[2 * g], c0 = c[2 * g], a1 = a[2 * g + 1], c1 = c[2 * g + 1];
    const uint8_t* q = qs + 32 * g;
    float* out = o + 64 * g;
    for (int i = 0; i < 32; ++i) {
      int lo = q[i] & 15, hi = q[i] >> 4;
      if constexpr (kFive) {
        lo |= ((qh[i] >> (2 * g)) & 1) << 4;
        hi |= ((qh[i] >> (2 * g + 1)) & 1) << 4;
      }
      out[i] = a0 * static_cast<float>(lo) - c0;
      out[32 + i] = a1 * static_cast<float>(hi) - c1;
    }
  }
}

// Q6_K: two halves of 128; element 128h + 32s + i from a nibble of ql and two bits of qh, scales per 16.
ENGINE_VEC_FN inline void decode_q6k(const uint8_t* b, float* o) {
  const float d = fp16_to_f32(load_fp16(b + 208));
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    float* out = o + 128 * h;
    for (int t = 0; t < 2; ++t) {  // i in [16t, 16t + 16): one scale per output run of 16
      const float a0 = d * static_cast<float>(sc[8 * h + t]), a1 = d * static_cast<float>(sc[8 * h + 2 + t]);
      const float a2 = d * static_cast<float>(sc[8 * h + 4 + t]), a3 = d * static_cast<float>(sc[8 * h + 6 + t]);
      for (int i = 16 * t; i < 16 * t + 16; ++i) {
        const int l0 = ql[i], l1 = ql[32 + i], hb = qh[i];
        out[i] = a0 * static_cast<float>(((l0 & 15) | ((hb & 3) << 4)) - 32);
        out[32 + i] = a1 * static_cast<float>(((l1 & 15) | (((hb >> 2) & 3) << 4)) - 32);
        out[64 + i] = a2 * static_cast<float>(((l0 >> 4) | (((hb >> 4) & 3) << 4)) - 32);
        out[96 + i] = a3 * static_cast<float>(((l1 >> 4) | (((hb >> 6) & 3) << 4)) - 32);
      }
    }
  }
}

// rows weight rows of k (a multiple of 256) columns, w_stride bytes apart -> dst [rows][k] fp32.
ENGINE_VEC_FN inline void kquant_decode_rows(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k,
                                             float* dst) {
  const int bytes = gguf_kquant_bytes(qtype);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* b = w + r * w_stride;
    float* o = dst + r * k;
    for (int64_t c = 0; c < k; c += 256, b += bytes, o += 256) {
      if (qtype == kQ4_K) decode_q45k<false>(b, o);
      else if (qtype == kQ5_K) decode_q45k<true>(b, o);
      else decode_q6k(b, o);
    }
  }
}

}  // namespace
}  // namespace engine_cpu
