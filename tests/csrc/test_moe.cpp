// fused_moe (fp32 and bf16) vs a double-precision reference written out here: routing, strided
// layouts, experts without tokens, sizes off the vector widths, the dot and gemm kernels (few and
// many rows per expert), several token chunks, 1 and 2 threads.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "moe.h"
#include "thread_pool.h"

using namespace engine_cpu;

namespace {

struct Shape {
  int64_t tokens, hidden, inter, experts;
  int top_k;
  bool renormalize;
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// Values stored as bf16 (when bf16) and their exact fp32 values, so both sides see the same inputs.
struct Buf {
  std::vector<float> f;
  std::vector<uint16_t> b;
  const void* ptr(bool bf16) const { return bf16 ? static_cast<const void*>(b.data()) : f.data(); }
};

Buf make(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Buf out{std::vector<float>(n), std::vector<uint16_t>(n)};
  for (size_t i = 0; i < n; ++i) {
    out.b[i] = f32_to_bf16(nd(rng) * scale);
    out.f[i] = bf16_to_f32(out.b[i]);
  }
  return out;
}

void run(const Shape& s, bool bf16, std::mt19937& rng, const char* isa) {
  const int64_t T = s.tokens, H = s.hidden, I = s.inter, E = s.experts, K = s.top_k;
  // Padded rows and experts: every stride differs from the dense one.
  const int64_t xs = H + 3, w13rs = H + 5, w13es = 2 * I * w13rs + 7, w2rs = I + 2, w2es = H * w2rs + 1, os = H + 1;
  const int64_t ls = E + 2;
  Buf x = make(T * xs, 1.0f, rng), w13 = make(E * w13es, 1.0f / std::sqrt(float(H)), rng);
  Buf w2 = make(E * w2es, 1.0f / std::sqrt(float(I)), rng);
  // Logits at least 0.2 apart within a row, so that the top-k choice cannot depend on rounding.
  std::vector<float> logits(T * ls);
  std::uniform_real_distribution<float> noise(0.0f, 0.05f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> perm(E);
    for (int e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int e = 0; e < E; ++e) logits[t * ls + e] = 0.25f * perm[e] - 0.125f * E + noise(rng);
  }
  std::vector<float> outf(T * os, -1.0f);
  std::vector<uint16_t> outb(T * os, 0xffff);
  MoeArgs a{x.ptr(bf16), xs, w13.ptr(bf16), w13es, w13rs, w2.ptr(bf16), w2es, w2rs, logits.data(), ls, DType::F32,
            bf16 ? static_cast<void*>(outb.data()) : outf.data(), os, T, H, I, E, s.top_k, s.renormalize,
            bf16 ? DType::BF16 : DType::F32};
  fused_moe(a);

  std::vector<double> p(E), hbuf(I);
  for (int64_t t = 0; t < T; ++t) {
    double mx = -1e30, sum = 0.0;
    for (int64_t e = 0; e < E; ++e) mx = std::max<double>(mx, logits[t * ls + e]);
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(logits[t * ls + e] - mx));
    std::vector<int64_t> order(E);
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](int64_t u, int64_t v) { return p[u] > p[v]; });
    double kept = 0.0;
    for (int64_t j = 0; j < K; ++j) kept += p[order[j]] / sum;
    std::vector<double> want(H, 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = order[j];
      const double wgt = p[e] / sum / (s.renormalize ? kept : 1.0);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < H; ++c) {
          g += double(x.f[t * xs + c]) * w13.f[e * w13es + i * w13rs + c];
          u += double(x.f[t * xs + c]) * w13.f[e * w13es + (I + i) * w13rs + c];
        }
        hbuf[i] = silu(g) * u;
      }
      for (int64_t c = 0; c < H; ++c) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += hbuf[i] * w2.f[e * w2es + c * w2rs + i];
        want[c] += wgt * y;
      }
    }
    for (int64_t c = 0; c < os; ++c) {
      if (c >= H) {  // padding between output rows stays untouched
        if (bf16 ? outb[t * os + c] != 0xffff : outf[t * os + c] != -1.0f) check::fail("wrote past a row of out");
        continue;
      }
      const double got = bf16 ? bf16_to_f32(outb[t * os + c]) : outf[t * os + c];
      // fp32: sums in another order, k <= a few hundred: ~1e-6. bf16: that, then one rounding (<= 2^-8 relative).
      if (!check::close(got, want[c], bf16 ? 1e-4 : 2e-5, bf16 ? 1.0 / 256 : 2e-5)) {
        check::fail(std::string(isa) + (bf16 ? " bf16" : " fp32") + " T=" + std::to_string(T) + " H=" +
                    std::to_string(H) + " I=" + std::to_string(I) + " E=" + std::to_string(E) + " k=" +
                    std::to_string(K) + " at " + std::to_string(t) + "," + std::to_string(c) + ": got " +
                    std::to_string(got) + " want " + std::to_string(want[c]));
        return;
      }
    }
  }
}

void errors() {
  float v = 0.0f;
  MoeArgs a{&v, 1, &v, 0, 1, &v, 0, 1, &v, 1, DType::F32, &v, 1, 1, 1, 1, 1, 2, false, DType::F32};
  try {
    fused_moe(a);
    check::fail("top_k > experts was accepted");
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find("top_k must be in [1, 1]") == std::string::npos) check::fail(e.what());
  }
  a.top_k = 1;
  a.x_stride = 0;
  a.hidden = 2;
  try {
    fused_moe(a);
    check::fail("a row stride smaller than the row was accepted");
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  errors();
  const Shape shapes[] = {
      {1, 64, 96, 8, 2, true},      // decode
      {6, 64, 96, 8, 2, true},      // a few experts without tokens
      {9, 48, 32, 16, 4, false},
      {40, 33, 20, 4, 1, false},    // sizes off every vector width
      {17, 80, 56, 16, 4, true},
      {3, 7, 5, 3, 3, true},        // tiny: k < one vector
      {26, 40, 24, 2, 1, true},     // about 13 rows per expert: gemm for fp32, dot for bf16
      {100, 20, 36, 2, 2, false},   // 100 rows per expert: gemm over 48 + 48 + 16 padded columns
      {600, 16, 24, 4, 2, false},   // several token chunks (kMoeChunkPairs / top_k tokens each)
  };
  return check::for_each_isa([&](const char* isa) {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (const Shape& s : shapes)
        for (bool bf16 : {false, true}) run(s, bf16, rng, isa);
    }
  });
}
