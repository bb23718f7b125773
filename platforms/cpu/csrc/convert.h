// Scalar fp16 / bf16 conversions, bit-exact with torch (round to nearest even; bf16 NaN -> 0x7FC0).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace engine_cpu {

enum class DType : int { F32 = 0, BF16 = 1, F16 = 2 };

// A binding's dtype argument as a DType; kernels without an fp16 path pass allow_f16 = false.
inline DType dtype_from_code(int code, bool allow_f16) {
  const bool known = code == static_cast<int>(DType::F32) || code == static_cast<int>(DType::BF16) ||
                     (allow_f16 && code == static_cast<int>(DType::F16));
  if (!known)
    throw std::invalid_argument(std::string("dtype code must be 0 (fp32), 1 (bf16)") + (allow_f16 ? " or 2 (fp16)" : "") +
                                ", got " + std::to_string(code));
  return static_cast<DType>(code);
}

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
  const float sub = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
  return sign ? -sub : sub;
}

// Round to nearest even (as torch's .half()): overflow to inf, NaN -> 0x7E00 with the sign kept.
inline uint16_t f32_to_fp16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {  // a normal fp16 (>= 2^-14): rebias the exponent, round the 13 dropped bits
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal or zero, in units of 2^-24 (scaling by a power of two is exact); lrint rounds half to even.
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::lrint(bits_to_f32(a) * 16777216.0f)));
}

inline uint16_t load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

inline float bf16_to_f32(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace engine_cpu
