// The fp16 linear driver: validation, x widened to fp32 once, threads over weight panels, fp16 output.
#include "fp16_linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "convert.h"
#include "thread_pool.h"

namespace engine_cpu {
namespace {

Fp16PanelFn panel_fn() {
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return fp16_panel_avx512;
    case Isa::Avx2: return fp16_panel_avx2;
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return fp16_panel_neon;
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return fp16_panel_vsx;
#endif
    default: return fp16_panel_scalar;
  }
}

constexpr int64_t kMinChunkWork = 1 << 15;  // multiply-adds below which a chunk stays on one thread
constexpr int64_t kTileM = 8;               // rows of x per panel call (their fp32 rows stay in L1/L2)

}  // namespace

void fp16_linear(const Fp16LinearArgs& a) {
  if (a.m < 0 || a.n < 0 || a.k <= 0)
    throw std::invalid_argument("fp16_linear: need m, n >= 0 and k > 0, got m " + std::to_string(a.m) + ", n " +
                                std::to_string(a.n) + ", k " + std::to_string(a.k));
  if (a.x_stride < a.k || a.w_stride < a.k || a.y_stride < a.n)
    throw std::invalid_argument("fp16_linear: a row stride is smaller than its row");
  if (a.m == 0 || a.n == 0) return;
  const Fp16PanelFn fn = panel_fn();
  thread_local std::vector<float> xf;
  xf.resize(static_cast<size_t>(a.m * a.k));
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t c = 0; c < a.k; ++c) xf[i * a.k + c] = fp16_to_f32(a.x[i * a.x_stride + c]);
  const float* x = xf.data();
  const int64_t tiles = (a.n + kFp16PanelRows - 1) / kFp16PanelRows;
  const int64_t grain = std::max<int64_t>(1, kMinChunkWork / (a.k * kFp16PanelRows * a.m));
  for_dynamic_chunks(tiles, grain, [&](int64_t t0, int64_t t1) {
    float out[kTileM * kFp16PanelRows];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kFp16PanelRows;
      const int rows = static_cast<int>(std::min<int64_t>(kFp16PanelRows, a.n - n0));
      for (int64_t m0 = 0; m0 < a.m; m0 += kTileM) {
        const int64_t mt = std::min(kTileM, a.m - m0);
        fn(x + m0 * a.k, a.k, mt, a.w + n0 * a.w_stride, a.w_stride, rows, a.k, out);
        for (int64_t i = 0; i < mt; ++i)
          for (int j = 0; j < rows; ++j)
            a.y[(m0 + i) * a.y_stride + n0 + j] =
                f32_to_fp16(out[i * kFp16PanelRows + j] + (a.bias ? fp16_to_f32(a.bias[n0 + j]) : 0.0f));
      }
    }
  });
}

}  // namespace engine_cpu
