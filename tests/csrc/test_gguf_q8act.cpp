// The Q8-activation GGUF linear vs its definition, computed here in double: x rounded to Q8 blocks
// (d = max|x| / 127 in float, q = nearest-even of x * (1 / d)), weights decoded from the format.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.h"
#include "gguf_block_ref.h"
#include "convert.h"
#include "gguf_dequant.h"
#include "gguf_q8act.h"

using namespace engine_cpu;

namespace {

void run(int qtype, int64_t m, int64_t n, int64_t k, std::mt19937& rng, const char* isa) {
  const int bb = gguf_block_bytes(qtype);
  const int64_t nb = k / 32, row_bytes = nb * bb;
  std::vector<uint8_t> raw(n * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255), e(5, 12), mant(0, 1023), sign(0, 1);
  for (auto& v : raw) v = static_cast<uint8_t>(byte(rng));
  for (int64_t blk = 0; blk < n * nb; ++blk) {  // finite fp16 scales (and Q4_1 minimums) of either sign
    for (int off = 0; off < (qtype == kQ4_1 ? 4 : 2); off += 2) {
      const uint16_t h = static_cast<uint16_t>((sign(rng) << 15) | (e(rng) << 10) | mant(rng));
      std::memcpy(raw.data() + blk * bb + off, &h, 2);
    }
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n, -1.0f);
  for (auto& v : x) v = normal(rng);
  if (m > 1) std::fill(x.begin() + k, x.begin() + k + 32, 0.0f);  // a zero block: d = 0
  gguf_linear_q8act({qtype, x.data(), k, m, k, raw.data(), row_bytes, n, y.data(), n, DType::F32});

  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> xq(k);
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x.data() + i * k + 32 * b;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
      for (int j = 0; j < 32; ++j) xq[32 * b + j] = std::nearbyint(xb[j] * inv) * static_cast<double>(d);
    }
    for (int64_t r = 0; r < n; ++r) {
      double want = 0.0, scale = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double t = xq[c] * gguf_weight_value(qtype, raw.data() + r * row_bytes + (c / 32) * bb, c % 32);
        want += t;
        scale += std::fabs(t);
      }
      const double got = y[i * n + r];
      if (!(std::fabs(got - want) <= 1e-5 * scale + 1e-30)) {
        check::fail(std::string(isa) + " (" + gguf_q8act_variant() + ") qtype " + std::to_string(qtype) + " m " +
                    std::to_string(m) + " k " + std::to_string(k) + " [" + std::to_string(i) + ", " +
                    std::to_string(r) + "]: got " + std::to_string(got) + " want " + std::to_string(want));
        return;
      }
    }
  }
}

// The ISA's quantizer against the contract, bit for bit: d = max|x| / 127, q = nearest-even of x * (1 / d)
// (blocks with max|x| = 127 make d = 1 and put exact ties in), d and s = d * sum(q) / lanes stored `lanes` times.
void check_quantize(std::mt19937& rng, const char* isa) {
  const GgufQ8Kernels kern = gguf_q8_kernels();
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> half(-127, 126);
  for (int64_t k : {32, 96, 576}) {
    const int64_t nb = k / 32;
    std::vector<float> x(k);
    for (auto& v : x) v = normal(rng);
    for (int j = 0; j < 32; ++j) x[j] = j == 7 ? -127.0f : static_cast<float>(half(rng)) + 0.5f;  // ties
    if (nb > 1) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // d = 0
    std::vector<int8_t> q(k, 99);
    std::vector<float> d(nb * kern.lanes, -1.0f), s(nb * kern.lanes, -1.0f);
    kern.quantize(x.data(), k, q.data(), d.data(), s.data());
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      const float db = amax / 127.0f, inv = db > 0.0f ? 1.0f / db : 0.0f;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int want = static_cast<int>(std::nearbyint(x[32 * b + j] * inv));
        sum += want;
        if (q[32 * b + j] != want)
          return check::fail(std::string(isa) + " quantize k " + std::to_string(k) + " q[" + std::to_string(32 * b + j) +
                             "] = " + std::to_string(q[32 * b + j]) + ", want " + std::to_string(want));
      }
      const float sb = db * static_cast<float>(sum) / static_cast<float>(kern.lanes);
      for (int l = 0; l < kern.lanes; ++l)
        if (d[b * kern.lanes + l] != db || s[b * kern.lanes + l] != sb)
          return check::fail(std::string(isa) + " quantize k " + std::to_string(k) + " block " + std::to_string(b) +
                             ": d, s = " + std::to_string(d[b * kern.lanes + l]) + ", " +
                             std::to_string(s[b * kern.lanes + l]) + ", want " + std::to_string(db) + ", " +
                             std::to_string(sb));
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    std::printf("%s: kernel variant %s\n", isa, gguf_q8act_variant());
    check_quantize(rng, isa);
    for (int qtype : {kQ4_0, kQ4_1, kQ8_0})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 32}, {2, 9, 96}, {5, 7, 576},
                             {1, 130, 1536}, {7, 3, 64}})
        run(qtype, m, n, k, rng, isa);
  });
}
