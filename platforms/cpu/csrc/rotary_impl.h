// Rotary embedding of one token's heads (rotary.h has the contract), written once on the streaming
// members of vec.h and instantiated per ISA by small_ops_<isa>.cpp.
// neox: pairs (j, j + rot/2), lanes() pairs per step. GPT-J: pairs (2j, 2j + 1) interleaved; a vector
// of channels is multiplied by the pair's cos (dup_pairs) and added to the pair-swapped channels times
// the sin with the even lanes negated: a*c + b*(-s) == a*c - b*s exactly, so both forms round alike.
// The last partial vector of a head uses the *_n loads and stores.
#include <cstring>

#include "rotary.h"
#include "vec_dtype.h"

namespace engine_cpu {
namespace {

template <class V, DType D, bool kFull>
ENGINE_VEC_FN inline void rope_neox(const RotaryRow& r, int64_t o, int64_t j, size_t n) {
  using F = typename V::F;
  const int64_t half = r.rot_dim / 2;
  const F c = kFull ? V::load(r.cos + j) : V::load_n(r.cos + j, n);
  const F s = kFull ? V::load(r.sin + j) : V::load_n(r.sin + j, n);
  const F a = vld<V, D, kFull>(r.x, o + j, n), b = vld<V, D, kFull>(r.x, o + half + j, n);
  vst<V, D, kFull>(r.out, o + j, V::sub(V::mul(a, c), V::mul(b, s)), n);
  vst<V, D, kFull>(r.out, o + half + j, V::add(V::mul(b, c), V::mul(a, s)), n);
}

// Pairs j .. j + n/2 = channels [2j, 2j + n) (n even).
template <class V, DType D, bool kFull>
ENGINE_VEC_FN inline void rope_gptj(const RotaryRow& r, int64_t o, int64_t j, size_t n) {
  using F = typename V::F;
  const F c = kFull ? V::dup_pairs(r.cos + j) : V::dup_pairs_n(r.cos + j, n);
  const F s = kFull ? V::dup_pairs(r.sin + j) : V::dup_pairs_n(r.sin + j, n);
  const F x = vld<V, D, kFull>(r.x, o + 2 * j, n);
  vst<V, D, kFull>(r.out, o + 2 * j, V::add(V::mul(x, c), V::mul(V::swap_pairs(x), V::neg_even(s))), n);
}

template <class V, DType D>
ENGINE_VEC_FN void rotary_rows(const RotaryRow& r) {
  const int64_t half = r.rot_dim / 2, es = dtype_size(D), L = static_cast<int64_t>(V::lanes());
  for (int64_t h = 0; h < r.heads; ++h) {
    const int64_t o = h * r.head_dim;
    if (r.neox) {
      int64_t j = 0;
      for (; j + L <= half; j += L) rope_neox<V, D, true>(r, o, j, L);
      if (j < half) rope_neox<V, D, false>(r, o, j, half - j);
    } else {
      int64_t j = 0;
      for (; 2 * j + L <= r.rot_dim; j += L / 2) rope_gptj<V, D, true>(r, o, j, L);
      if (2 * j < r.rot_dim) rope_gptj<V, D, false>(r, o, j, r.rot_dim - 2 * j);
    }
    if (r.rot_dim < r.head_dim)
      std::memcpy(static_cast<char*>(r.out) + (o + r.rot_dim) * es,
                  static_cast<const char*>(r.x) + (o + r.rot_dim) * es, (r.head_dim - r.rot_dim) * es);
  }
}

template <class V>
ENGINE_VEC_FN void rotary_impl(const RotaryRow& r) {
  switch (r.dtype) {
    case DType::BF16: return rotary_rows<V, DType::BF16>(r);
    case DType::F16: return rotary_rows<V, DType::F16>(r);
    default: return rotary_rows<V, DType::F32>(r);
  }
}

}  // namespace
}  // namespace engine_cpu
