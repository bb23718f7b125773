// fp16 linear (GEMV at m = 1, GEMM above) vs a double-precision reference on the fp16 inputs, on every ISA
// variant the CPU runs; and the fp32 -> fp16 rounding against the hardware conversion where there is one.
#include <cmath>
#include <vector>

#include "check.h"
#include "convert.h"
#include "fp16_linear.h"
#include "thread_pool.h"
#ifdef ENGINE_X86
#include <immintrin.h>
#endif

using namespace engine_cpu;

namespace {

#ifdef ENGINE_X86
__attribute__((target("f16c"))) uint16_t hw_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#endif

void check_rounding(std::mt19937& rng) {
  for (uint32_t h = 0; h < 65536; ++h) {  // every fp16 value survives the round trip
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    if (f32_to_fp16(f) != h) return check::fail("f32_to_fp16(fp16_to_f32(" + std::to_string(h) + ")) differs");
  }
#ifdef ENGINE_X86
  if (!cpu_supports(Isa::Avx2)) return;
  for (int i = 0; i < 200000; ++i) {  // random bit patterns (halfway cases, subnormals, overflow) vs F16C
    const float f = bits_to_f32(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const uint16_t want = hw_fp16(f);
    if (f32_to_fp16(f) != want) return check::fail("f32_to_fp16 differs from vcvtps2ph at " + std::to_string(f));
  }
#else
  (void)rng;
#endif
}

void run(int64_t m, int64_t n, int64_t k, std::mt19937& rng, const char* isa) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t xs = k + 5, ws = k + 3, ys = n + 1;
  std::vector<uint16_t> x(m * xs), w(n * ws), y(m * ys, 0xffff);
  for (auto& v : x) v = f32_to_fp16(normal(rng));
  for (auto& v : w) v = f32_to_fp16(normal(rng));
  fp16_linear({x.data(), xs, w.data(), ws, y.data(), ys, m, n, k});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < n; ++r) {
      double want = 0, scale = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double t = double(fp16_to_f32(x[i * xs + c])) * fp16_to_f32(w[r * ws + c]);
        want += t;
        scale += std::fabs(t);
      }
      const double got = fp16_to_f32(y[i * ys + r]);
      if (!(std::fabs(got - want) <= 1e-3 * std::fabs(want) + 1e-5 * scale)) {
        check::fail(std::string(isa) + " fp16 m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                    std::to_string(k) + " [" + std::to_string(i) + ", " + std::to_string(r) + "]: got " +
                    std::to_string(got) + " want " + std::to_string(want));
        return;
      }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  set_num_threads(2);
  check_rounding(rng);
  return check::for_each_isa([&](const char* isa) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {1, 7, 33}, {1, 130, 576}, {3, 5, 17},
                           {9, 11, 100}, {2, 67, 1536}, {17, 4, 64}})
      run(m, n, k, rng, isa);
  });
}
