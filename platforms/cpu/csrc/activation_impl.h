// silu_and_mul (activation.h has the contract), written once on the streaming members of vec.h and
// instantiated per ISA by small_ops_<isa>.cpp: silu(g) = g / (1 + exp(-g)) with the backend's
// vector exp (about 2 ulp), whole vectors then one partial vector per row.
#include "activation.h"
#include "vec_dtype.h"

namespace engine_cpu {
namespace {

template <class V, DType D, bool kFull>
ENGINE_VEC_FN inline void silu_step(const void* x, void* out, int64_t d, int64_t i, size_t n) {
  using F = typename V::F;
  const F g = vld<V, D, kFull>(x, i, n), u = vld<V, D, kFull>(x, d + i, n);
  const F e = V::exp(V::sub(V::zero(), g));
  vst<V, D, kFull>(out, i, V::mul(V::div(g, V::add(V::set1(1.0f), e)), u), n);
}

template <class V, DType D>
ENGINE_VEC_FN void silu_rows(const SiluMulArgs& a, int64_t r0, int64_t r1) {
  const int64_t es = dtype_size(D), L = static_cast<int64_t>(V::lanes());
  for (int64_t r = r0; r < r1; ++r) {
    const char* x = static_cast<const char*>(a.x) + r * a.x_stride * es;
    char* out = static_cast<char*>(a.out) + r * a.out_stride * es;
    int64_t i = 0;
    for (; i + L <= a.d; i += L) silu_step<V, D, true>(x, out, a.d, i, L);
    if (i < a.d) silu_step<V, D, false>(x, out, a.d, i, a.d - i);
  }
}

template <class V>
ENGINE_VEC_FN void silu_and_mul_impl(const SiluMulArgs& a, int64_t r0, int64_t r1) {
  switch (a.dtype) {
    case DType::BF16: return silu_rows<V, DType::BF16>(a, r0, r1);
    case DType::F16: return silu_rows<V, DType::F16>(a, r0, r1);
    default: return silu_rows<V, DType::F32>(a, r0, r1);
  }
}

}  // namespace
}  // namespace engine_cpu
