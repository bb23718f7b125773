// The row-interleaved GGUF layout (gguf_packed.h): pack / unpack round trip, and the packed Q8-activation linear vs
// its definition computed here in double (as test_gguf_q8act.cpp), on every ISA variant: where a variant has no
// packed kernel (gguf_packed_variant() is ""), the same call runs gguf_linear_q8act on the raw rows. The same for
// the packed fp32-activation linear (gguf_linear_packed: x never quantized) against sum_k x[k] * w[k] in double,
// and its gate (gguf_packed_f32_variant() is "" exactly where gguf_packed_variant() is).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "check.h"
#include "convert.h"
#include "gguf_block_ref.h"
#include "gguf_dequant.h"
#include "gguf_packed.h"

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
  const std::string what = std::string(isa) + " (" + gguf_packed_variant() + ") qtype " + std::to_string(qtype) +
                           " m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k);
  std::vector<uint8_t> packed(gguf_packed_bytes(qtype, n, k), 0xAB), back(raw.size(), 0);
  gguf_pack(qtype, raw.data(), row_bytes, n, k, packed.data());
  gguf_unpack(qtype, packed.data(), n, k, back.data(), row_bytes);
  if (back != raw) return check::fail(what + ": unpack(pack(raw)) != raw");

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n, -1.0f);
  for (auto& v : x) v = normal(rng);
  if (m > 1) std::fill(x.begin() + k, x.begin() + k + 32, 0.0f);  // a zero block: d = 0
  gguf_linear_q8act_packed({qtype, x.data(), k, m, k, raw.data(), row_bytes, n, y.data(), n, DType::F32},
                           packed.data());

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
      if (!(std::fabs(got - want) <= 1e-5 * scale + 1e-30))
        return check::fail(what + " [" + std::to_string(i) + ", " + std::to_string(r) + "]: got " +
                           std::to_string(got) + " want " + std::to_string(want));
    }
  }

  // fp32 activations on the same packed copy (x rows 3 floats further apart than k).
  const std::string what32 = what + " fp32 (" + gguf_packed_f32_variant() + ")";
  if (!*gguf_packed_f32_variant() != !*gguf_packed_variant()) return check::fail(what32 + ": gates disagree");
  const int64_t xs = k + 3;
  std::vector<float> x32(m * xs, 7.0f), y32(m * n, -1.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c) x32[i * xs + c] = normal(rng);
  gguf_linear_packed({qtype, x32.data(), xs, m, k, raw.data(), row_bytes, n, y32.data(), n, DType::F32},
                     packed.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < n; ++r) {
      double want = 0.0, scale = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double w = gguf_weight_value(qtype, raw.data() + r * row_bytes + (c / 32) * bb, c % 32);
        const double t = x32[i * xs + c] * w;
        want += t;
        scale += std::fabs(t);
      }
      const double got = y32[i * n + r];
      if (!(std::fabs(got - want) <= 1e-5 * scale + 1e-30))
        return check::fail(what32 + " [" + std::to_string(i) + ", " + std::to_string(r) + "]: got " +
                           std::to_string(got) + " want " + std::to_string(want));
    }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    std::printf("%s: packed variants '%s' / fp32 '%s'\n", isa, gguf_packed_variant(), gguf_packed_f32_variant());
    for (int qtype : {kQ4_0, kQ4_1, kQ8_0})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 32}, {2, 17, 96}, {9, 16, 576},
                             {1, 130, 1536}, {33, 3, 64}, {13, 33, 96}})
        run(qtype, m, n, k, rng, isa);
  });
}
