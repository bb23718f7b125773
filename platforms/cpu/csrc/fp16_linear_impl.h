// The fp16 linear panel, written once on the vector layer (vec.h); fp16_linear_{scalar,avx2,avx512,neon,
// vsx}.cpp define ENGINE_VEC_FN and instantiate it. A panel is up to four weight rows: every x vector
// loaded feeds four FMAs (one per row), and each weight vector is widened from fp16 once per x row
// (m = 1, the decode GEMV, widens each weight element exactly once). Columns past the last whole
// vector go through the scalar tail.
#include "convert.h"
#include "fp16_linear.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including fp16_linear_impl.h"
#endif

namespace engine_cpu {
namespace {

template <class V, int R>
ENGINE_VEC_FN inline void fp16_rows(const float* x, const uint16_t* w, int64_t w_stride, int64_t k, float* out) {
  using F = typename V::F;
  constexpr int W = V::W;
  F acc[R];
  for (int j = 0; j < R; ++j) acc[j] = V::zero();
  int64_t c = 0;
  for (; c + W <= k; c += W) {
    const F xv = V::load(x + c);
    for (int j = 0; j < R; ++j) acc[j] = V::fma(xv, V::load_fp16(w + j * w_stride + c), acc[j]);
  }
  for (int j = 0; j < R; ++j) {
    float s = V::reduce_add(acc[j]);
    for (int64_t t = c; t < k; ++t) s += x[t] * fp16_to_f32(w[j * w_stride + t]);
    out[j] = s;
  }
}

template <class V>
ENGINE_VEC_FN void fp16_panel_impl(const float* x, int64_t x_stride, int64_t m, const uint16_t* w, int64_t w_stride,
                                   int rows, int64_t k, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    float* o = out + i * kFp16PanelRows;
    const float* xi = x + i * x_stride;
    switch (rows) {
      case 4: fp16_rows<V, 4>(xi, w, w_stride, k, o); break;
      case 3: fp16_rows<V, 3>(xi, w, w_stride, k, o); break;
      case 2: fp16_rows<V, 2>(xi, w, w_stride, k, o); break;
      default: fp16_rows<V, 1>(xi, w, w_stride, k, o); break;
    }
  }
}

}  // namespace
}  // namespace engine_cpu
