// RMSNorm (plain and fused with the residual add; fp32, bf16 and fp16 storage) vs a double-precision
// reference, on every ISA variant the CPU runs: the one kernel source (rms_norm_impl.h) per backend.
#include <vector>

#include "check.h"
#include "convert.h"
#include "rms_norm.h"

using namespace engine_cpu;

namespace {

float to_f(uint16_t v, DType dt) { return dt == DType::BF16 ? bf16_to_f32(v) : fp16_to_f32(v); }
uint16_t from_f(float v, DType dt) { return dt == DType::BF16 ? f32_to_bf16(v) : f32_to_fp16(v); }
float rounded(float v, DType dt) { return dt == DType::F32 ? v : to_f(from_f(v, dt), dt); }

void run(int64_t rows, int64_t hidden, bool fused, DType dt, std::mt19937& rng, const char* isa) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  const size_t N = size_t(rows) * hidden;
  std::vector<float> x(N), res(N), w(hidden), out(N), sum(N);
  for (auto& v : x) v = rounded(n(rng), dt);
  for (auto& v : res) v = rounded(n(rng), dt);
  for (auto& v : w) v = rounded(1.0f + 0.5f * n(rng), dt);
  std::vector<uint16_t> xh(N), rh(N), wh(hidden), oh(N), sh(N);
  for (size_t i = 0; i < N; ++i) xh[i] = from_f(x[i], dt), rh[i] = from_f(res[i], dt);
  for (int64_t i = 0; i < hidden; ++i) wh[i] = from_f(w[i], dt);
  const bool h16 = dt != DType::F32;
  auto p = [&](std::vector<float>& f, std::vector<uint16_t>& h) -> void* {
    return h16 ? static_cast<void*>(h.data()) : static_cast<void*>(f.data());
  };
  const float eps = 1e-6f;
  rms_norm({p(x, xh), hidden, fused ? p(res, rh) : nullptr, hidden, p(w, wh), p(out, oh), hidden,
            fused ? p(sum, sh) : nullptr, hidden, rows, hidden, eps, dt});
  if (h16)
    for (size_t i = 0; i < N; ++i) out[i] = to_f(oh[i], dt), sum[i] = to_f(sh[i], dt);
  const double tol = dt == DType::F32 ? 1e-5 : dt == DType::BF16 ? 1e-2 : 2e-3;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> s(hidden);
    double ss = 0;
    for (int64_t c = 0; c < hidden; ++c) {
      s[c] = fused ? rounded(x[r * hidden + c] + res[r * hidden + c], dt) : x[r * hidden + c];
      ss += s[c] * s[c];
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t c = 0; c < hidden; ++c) {
      const double want = s[c] * inv * w[c];
      if (!check::close(out[r * hidden + c], want, tol, tol) || (fused && sum[r * hidden + c] != s[c])) {
        check::fail(std::string(isa) + (fused ? " fused" : " plain") + " dtype " + std::to_string(int(dt)) +
                    " hidden " + std::to_string(hidden) + " at " + std::to_string(r) + "," + std::to_string(c) +
                    ": got " + std::to_string(out[r * hidden + c]) + ", want " + std::to_string(want));
        return;
      }
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (int64_t hidden : {1, 7, 16, 33, 576, 4099})
        for (bool fused : {false, true}) run(3, hidden, fused, dt, rng, isa);
  });
}
