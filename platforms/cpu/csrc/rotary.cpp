// rotary_embedding: validation, the split over tokens, and the portable scalar path.
#include "rotary.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "thread_pool.h"

namespace engine_cpu {
namespace {

template <bool kBf16>
inline float ld(const void* p, int64_t i) {
  if constexpr (kBf16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

template <bool kBf16>
inline void st(void* p, int64_t i, float v) {
  if constexpr (kBf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  else static_cast<float*>(p)[i] = v;
}

template <bool kBf16>
void run(const RotaryRow& r, int64_t j0, bool copy_tail) {
  const int64_t half = r.rot_dim / 2, es = kBf16 ? 2 : 4;
  for (int64_t h = 0; h < r.heads; ++h) {
    const int64_t o = h * r.head_dim;
    for (int64_t j = j0; j < half; ++j) {
      const int64_t ia = o + (r.neox ? j : 2 * j), ib = o + (r.neox ? j + half : 2 * j + 1);
      const float a = ld<kBf16>(r.x, ia), b = ld<kBf16>(r.x, ib), c = r.cos[j], s = r.sin[j];
      st<kBf16>(r.out, ia, a * c - b * s);
      st<kBf16>(r.out, ib, b * c + a * s);
    }
    if (copy_tail && r.rot_dim < r.head_dim)
      std::memcpy(static_cast<char*>(r.out) + (o + r.rot_dim) * es,
                  static_cast<const char*>(r.x) + (o + r.rot_dim) * es, (r.head_dim - r.rot_dim) * es);
  }
}

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("rotary_embedding: " + what); }

}  // namespace

void rotary_row_scalar(const RotaryRow& r, int64_t j0, bool copy_tail) {
  if (r.dtype == DType::BF16) run<true>(r, j0, copy_tail);
  else run<false>(r, j0, copy_tail);
}

void rotary_embedding(const RotaryArgs& a) {
  if (a.dtype != DType::F32 && a.dtype != DType::BF16) bad("dtype must be fp32 or bf16");
  if (a.q_tokens != a.tokens || a.k_tokens != a.tokens)
    bad("positions, q and k disagree on the number of tokens (" + std::to_string(a.tokens) + ", " +
        std::to_string(a.q_tokens) + ", " + std::to_string(a.k_tokens) + ")");
  if (a.rot_dim <= 0 || a.rot_dim % 2 || a.rot_dim > a.head_dim) bad("rot_dim must be even and in (0, head_dim]");
  for (int64_t t = 0; t < a.tokens; ++t)
    if (a.positions[t] < 0 || a.positions[t] >= a.max_pos)
      bad("positions[" + std::to_string(t) + "] = " + std::to_string(a.positions[t]) +
          " is outside the cos_sin_cache's " + std::to_string(a.max_pos) + " positions");
  void (*fn)(const RotaryRow&) = [](const RotaryRow& r) { rotary_row_scalar(r, 0, true); };
#ifdef ENGINE_X86
  if (current_isa() == Isa::Avx512) fn = rotary_row_avx512;
  else if (current_isa() == Isa::Avx2) fn = rotary_row_avx2;
#endif
  const int64_t es = a.dtype == DType::BF16 ? 2 : 4, half = a.rot_dim / 2;
  const int64_t per_token = (a.q_heads + a.k_heads) * a.head_dim;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(per_token, 1));
  parallel_for(a.tokens, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = a.cos_sin + a.positions[t] * a.rot_dim;
      RotaryRow r{static_cast<const char*>(a.q) + t * a.q_stride * es,
                  static_cast<char*>(a.q_out) + t * a.q_heads * a.head_dim * es,
                  a.q_heads, a.head_dim, a.rot_dim, cs, cs + half, a.neox, a.dtype};
      fn(r);
      r.x = static_cast<const char*>(a.k) + t * a.k_stride * es;
      r.out = static_cast<char*>(a.k_out) + t * a.k_heads * a.head_dim * es;
      r.heads = a.k_heads;
      fn(r);
    }
  });
}

}  // namespace engine_cpu
