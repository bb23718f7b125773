// fp16 linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), x, w, bias and y in fp16, products and sums in
// fp32 (the accumulation torch's CPU fp16 matmul does), y rounded to fp16 once. Threads split the weight rows in
// panels of kFp16PanelRows; each panel row is read once per call whatever m is (m = 1 is the decode GEMV).
// The math is fp16_linear_impl.h, written once on the vector layer and instantiated per ISA.
#pragma once

#include <cstdint>

#include "isa.h"

namespace engine_cpu {

struct Fp16LinearArgs {
  const uint16_t* x;  // [m, k], unit stride along k
  int64_t x_stride;
  const uint16_t* w;  // [n, k], unit stride along k
  int64_t w_stride;
  uint16_t* y;  // [m, n], unit stride along n
  int64_t y_stride;
  int64_t m, n, k;
  const uint16_t* bias = nullptr;  // [n] or none: added in fp32 before y's one rounding
};

// Validates (std::invalid_argument) and runs on the current ISA.
void fp16_linear(const Fp16LinearArgs& a);

constexpr int kFp16PanelRows = 4;

// out[i * kFp16PanelRows + j] = x row i (fp32, i < m) . w row j (fp16, j < rows <= kFp16PanelRows).
using Fp16PanelFn = void (*)(const float* x, int64_t x_stride, int64_t m, const uint16_t* w, int64_t w_stride,
                             int rows, int64_t k, float* out);

void fp16_panel_scalar(const float*, int64_t, int64_t, const uint16_t*, int64_t, int, int64_t, float*);
#ifdef ENGINE_X86
void fp16_panel_avx2(const float*, int64_t, int64_t, const uint16_t*, int64_t, int, int64_t, float*);
void fp16_panel_avx512(const float*, int64_t, int64_t, const uint16_t*, int64_t, int, int64_t, float*);
#endif
#ifdef ENGINE_ARM64
void fp16_panel_neon(const float*, int64_t, int64_t, const uint16_t*, int64_t, int, int64_t, float*);
#endif
#ifdef ENGINE_VSX
void fp16_panel_vsx(const float*, int64_t, int64_t, const uint16_t*, int64_t, int, int64_t, float*);
#endif

}  // namespace engine_cpu
