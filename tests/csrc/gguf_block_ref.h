// The tests' reference for one GGUF block: element j of a Q4_0, Q4_1 or Q8_0 block, in double precision.
#pragma once

#include <cstdint>
#include <cstring>

#include "convert.h"
#include "gguf_dequant.h"

inline double gguf_weight_value(int qtype, const uint8_t* b, int j) {
  using namespace engine_cpu;
  uint16_t d16, m16;
  std::memcpy(&d16, b, 2);
  const double d = fp16_to_f32(d16);
  if (qtype == kQ8_0) return static_cast<int8_t>(b[2 + j]) * d;
  const uint8_t* q = b + (qtype == kQ4_0 ? 2 : 4);
  const int nib = j < 16 ? (q[j] & 0x0F) : (q[j - 16] >> 4);
  if (qtype == kQ4_0) return (nib - 8) * d;
  std::memcpy(&m16, b + 2, 2);
  return nib * d + fp16_to_f32(m16);
}
