// RMSNorm (rms_norm.h has the contract), written once on the streaming members of vec.h and
// instantiated per ISA by small_ops_<isa>.cpp. Whole vectors, two sum-of-squares accumulators, then
// one partial vector for the last hidden % lanes() values (a masked or zero-filled load).
#include <cmath>

#include "rms_norm.h"
#include "vec_dtype.h"

namespace engine_cpu {
namespace {

// acc + s*s for values [i, i + n) of one row; fused: s = x + res, stored to sum_out, and squared as
// stored (rounded to the storage dtype), as the reference does.
template <class V, DType D, bool kFused, bool kFull>
ENGINE_VEC_FN inline typename V::F rms_sq(const void* x, const void* res, void* s, int64_t i, size_t n,
                                          typename V::F acc) {
  typename V::F v = vld<V, D, kFull>(x, i, n);
  if constexpr (kFused) {
    v = V::add(v, vld<V, D, kFull>(res, i, n));
    vst<V, D, kFull>(s, i, v, n);
    if constexpr (D != DType::F32) v = vld<V, D, kFull>(s, i, n);  // the rounded value
  }
  return V::fma(v, v, acc);
}

template <class V, DType D, bool kFull>
ENGINE_VEC_FN inline void rms_out(const void* src, const void* w, void* out, int64_t i, size_t n, typename V::F inv) {
  vst<V, D, kFull>(out, i, V::mul(V::mul(vld<V, D, kFull>(src, i, n), inv), vld<V, D, kFull>(w, i, n)), n);
}

template <class V, DType D, bool kFused>
ENGINE_VEC_FN void rms_norm_rows(const RmsNormArgs& a) {
  using F = typename V::F;
  const int64_t h = a.hidden, es = dtype_size(D), L = static_cast<int64_t>(V::lanes());
  for (int64_t r = 0; r < a.rows; ++r) {
    const char* x = static_cast<const char*>(a.x) + r * a.x_stride * es;
    const char* res = kFused ? static_cast<const char*>(a.res) + r * a.res_stride * es : nullptr;
    char* s = kFused ? static_cast<char*>(a.sum_out) + r * a.sum_stride * es : nullptr;
    F acc0 = V::zero(), acc1 = V::zero();
    int64_t i = 0;
    for (; i + 2 * L <= h; i += 2 * L) {
      acc0 = rms_sq<V, D, kFused, true>(x, res, s, i, L, acc0);
      acc1 = rms_sq<V, D, kFused, true>(x, res, s, i + L, L, acc1);
    }
    if (i + L <= h) {
      acc0 = rms_sq<V, D, kFused, true>(x, res, s, i, L, acc0);
      i += L;
    }
    if (i < h) acc1 = rms_sq<V, D, kFused, false>(x, res, s, i, h - i, acc1);
    const float ss = V::reduce_add(V::add(acc0, acc1));
    const F inv = V::set1(1.0f / std::sqrt(ss / static_cast<float>(h) + a.eps));
    const void* src = kFused ? static_cast<const void*>(s) : x;
    char* out = static_cast<char*>(a.out) + r * a.out_stride * es;
    for (i = 0; i + L <= h; i += L) rms_out<V, D, true>(src, a.w, out, i, L, inv);
    if (i < h) rms_out<V, D, false>(src, a.w, out, i, h - i, inv);
  }
}

template <class V, DType D>
ENGINE_VEC_FN void rms_norm_dtype(const RmsNormArgs& a) {
  if (a.res != nullptr) rms_norm_rows<V, D, true>(a);
  else rms_norm_rows<V, D, false>(a);
}

template <class V>
ENGINE_VEC_FN void rms_norm_impl(const RmsNormArgs& a) {
  switch (a.dtype) {
    case DType::BF16: return rms_norm_dtype<V, DType::BF16>(a);
    case DType::F16: return rms_norm_dtype<V, DType::F16>(a);
    default: return rms_norm_dtype<V, DType::F32>(a);
  }
}

}  // namespace
}  // namespace engine_cpu
