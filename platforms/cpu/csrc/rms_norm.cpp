// Dispatcher and the portable scalar path.
#include "rms_norm.h"

#include <cmath>
#include <stdexcept>

#include "isa.h"

namespace engine_cpu {
namespace {

template <typename T>
inline float load(const void* p, int64_t i) {
  if constexpr (sizeof(T) == 2) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

template <typename T>
inline float store(void* p, int64_t i, float v) {  // returns the value as stored
  if constexpr (sizeof(T) == 2) {
    const uint16_t b = f32_to_bf16(v);
    static_cast<uint16_t*>(p)[i] = b;
    return bf16_to_f32(b);
  } else {
    static_cast<float*>(p)[i] = v;
    return v;
  }
}

template <typename T>  // T: float or uint16_t (bf16 bits)
void run(const RmsNormArgs& a) {
  const int64_t h = a.hidden;
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * a.x_stride;
    const void* src = x;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // a few partial sums: better accuracy than one chain
    if (a.res != nullptr) {
      const T* res = static_cast<const T*>(a.res) + r * a.res_stride;
      T* s = static_cast<T*>(a.sum_out) + r * a.sum_stride;
      for (int64_t i = 0; i < h; ++i) {
        const float v = store<T>(s, i, load<T>(x, i) + load<T>(res, i));
        acc[i & 7] += v * v;
      }
      src = s;
    } else {
      for (int64_t i = 0; i < h; ++i) {
        const float v = load<T>(x, i);
        acc[i & 7] += v * v;
      }
    }
    float ss = 0;
    for (float v : acc) ss += v;
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + a.eps);
    T* out = static_cast<T*>(a.out) + r * a.out_stride;
    for (int64_t i = 0; i < h; ++i) store<T>(out, i, (load<T>(src, i) * inv) * load<T>(a.w, i));
  }
}

}  // namespace

void rms_norm_scalar(const RmsNormArgs& a) {
  if (a.dtype == DType::BF16) run<uint16_t>(a);
  else run<float>(a);
}

void rms_norm(const RmsNormArgs& a) {
  if (a.hidden <= 0 || a.rows < 0) throw std::invalid_argument("rms_norm: hidden must be > 0 and rows >= 0");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16)
    throw std::invalid_argument("rms_norm: dtype must be fp32 or bf16");
  if (a.res != nullptr && a.sum_out == nullptr)
    throw std::invalid_argument("rms_norm: the fused variant needs sum_out");
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return rms_norm_avx512(a);
    case Isa::Avx2: return rms_norm_avx2(a);
#endif
    default: return rms_norm_scalar(a);
  }
}

}  // namespace engine_cpu
