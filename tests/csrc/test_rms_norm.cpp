// RMSNorm (plain and fused with the residual add) vs a double-precision reference.
#include <vector>

#include "check.h"
#include "rms_norm.h"

using namespace engine_cpu;

namespace {

void run(int64_t rows, int64_t hidden, bool fused, std::mt19937& rng, const char* isa) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(rows * hidden), res(rows * hidden), w(hidden), out(rows * hidden), sum(rows * hidden);
  for (auto& v : x) v = n(rng);
  for (auto& v : res) v = n(rng);
  for (auto& v : w) v = 1.0f + 0.5f * n(rng);
  const float eps = 1e-6f;
  rms_norm({x.data(), hidden, fused ? res.data() : nullptr, hidden, w.data(), out.data(), hidden,
            fused ? sum.data() : nullptr, hidden, rows, hidden, eps, DType::F32});
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < hidden; ++c) {
      double s = static_cast<double>(x[r * hidden + c]) + (fused ? res[r * hidden + c] : 0.0);
      ss += s * s;
    }
    double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t c = 0; c < hidden; ++c) {
      double s = static_cast<double>(x[r * hidden + c]) + (fused ? res[r * hidden + c] : 0.0);
      double want = s * inv * w[c];
      if (!check::close(out[r * hidden + c], want, 1e-5, 1e-5) ||
          (fused && !check::close(sum[r * hidden + c], s, 1e-6, 1e-6))) {
        check::fail(std::string(isa) + (fused ? " fused" : " plain") + " hidden " + std::to_string(hidden) +
                    " at " + std::to_string(r) + "," + std::to_string(c));
        return;
      }
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    for (int64_t hidden : {1, 7, 16, 33, 576, 4099})
      for (bool fused : {false, true}) run(3, hidden, fused, rng, isa);
  }, {"rvv", "vsx"});
}
