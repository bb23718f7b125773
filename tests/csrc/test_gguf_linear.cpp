// The fp32-activation GGUF linear (gemv at m = 1, decode + dot above) vs x @ dequant(W)^T computed here in
// double from the format, on every ISA variant the CPU runs, fp32 and bf16 activations; the K-quants against their
// decode; and the panel decode vs gguf_dequant bit for bit.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "gguf_block_ref.h"
#include "convert.h"
#include "gguf_dequant.h"
#include "gguf_linear.h"
#include "thread_pool.h"

using namespace engine_cpu;

namespace {

// n rows of random bytes, row_bytes apart, with a finite fp16 scale at each of `offsets` in each of the row's blocks
// of block_bytes (so no NaN or infinity scale hides a wrong value).
std::vector<uint8_t> random_scaled_rows(int64_t n, int64_t row_bytes, int64_t blocks, int block_bytes,
                                        const std::vector<int>& offsets, std::mt19937& rng) {
  std::vector<uint8_t> raw(n * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255), e(5, 12), mant(0, 1023), sign(0, 1);
  for (auto& v : raw) v = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t blk = 0; blk < blocks; ++blk)
      for (int off : offsets) {
        const uint16_t h = static_cast<uint16_t>((sign(rng) << 15) | (e(rng) << 10) | mant(rng));
        std::memcpy(raw.data() + r * row_bytes + blk * block_bytes + off, &h, 2);
      }
  return raw;
}

// n random rows of k / 32 blocks (Q4_0, Q4_1, Q8_0), row_bytes apart (padded past the blocks).
std::vector<uint8_t> random_rows(int qtype, int64_t n, int64_t k, int64_t row_bytes, std::mt19937& rng) {
  const std::vector<int> scales = qtype == kQ4_1 ? std::vector<int>{0, 2} : std::vector<int>{0};
  return random_scaled_rows(n, row_bytes, k / 32, gguf_block_bytes(qtype), scales, rng);
}

// The panel decode of the M > 1 path gives gguf_dequant's fp32 values bit for bit.
void decode_is_exact(int qtype, int rows, int64_t k, std::mt19937& rng, const char* isa) {
  const int64_t row_bytes = k / 32 * gguf_block_bytes(qtype) + 2;
  const std::vector<uint8_t> raw = random_rows(qtype, rows, k, row_bytes, rng);
  std::vector<float> got(rows * k), want(rows * k);
  gguf_linear_kernels(current_isa()).decode(qtype, raw.data(), row_bytes, rows, k, got.data(), fp16_lut());
  gguf_dequant_scalar({qtype, raw.data(), row_bytes, rows, k, want.data(), k, DType::F32});
  for (int64_t i = 0; i < rows * k; ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      check::fail(std::string(isa) + " decode qtype " + std::to_string(qtype) + " rows " + std::to_string(rows) +
                  " k " + std::to_string(k) + " element " + std::to_string(i) + ": got " + std::to_string(got[i]) +
                  " want " + std::to_string(want[i]));
      return;
    }
}

void run(int qtype, int64_t m, int64_t n, int64_t k, bool bf16, std::mt19937& rng, const char* isa) {
  const int bb = gguf_block_bytes(qtype);
  const int64_t nb = k / 32, row_bytes = nb * bb + 6;  // padded rows: w_stride > row bytes
  const std::vector<uint8_t> raw = random_rows(qtype, n, k, row_bytes, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t xs = k + 3, ys = n + 2;  // strided rows of x and y
  std::vector<float> x(m * xs), y(m * ys, -1.0f);
  for (auto& v : x) v = normal(rng);
  std::vector<uint16_t> xb(x.size()), yb(y.size());
  if (bf16)
    for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]), x[i] = bf16_to_f32(xb[i]);
  gguf_linear({qtype, bf16 ? static_cast<const void*>(xb.data()) : x.data(), xs, m, k, raw.data(), row_bytes, n,
               bf16 ? static_cast<void*>(yb.data()) : y.data(), ys, bf16 ? DType::BF16 : DType::F32});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < n; ++r) {
      double want = 0.0, scale = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t* blk = raw.data() + r * row_bytes + (c / 32) * bb;
        const double t = double(x[i * xs + c]) * gguf_weight_value(qtype, blk, c % 32);
        want += t;
        scale += std::fabs(t);
      }
      const double got = bf16 ? bf16_to_f32(yb[i * ys + r]) : y[i * ys + r];
      const double tol = bf16 ? 8e-3 * std::fabs(want) + 1e-5 * scale : 1e-5 * scale;
      if (!(std::fabs(got - want) <= tol + 1e-30)) {
        check::fail(std::string(isa) + (bf16 ? " bf16" : " fp32") + " qtype " + std::to_string(qtype) + " m " +
                    std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) + " [" +
                    std::to_string(i) + ", " + std::to_string(r) + "]: got " + std::to_string(got) + " want " +
                    std::to_string(want));
        return;
      }
    }
}

// K-quant rows (Q4_K, Q5_K, Q6_K) of k / 256 super-blocks: finite d (and dmin) scales.
std::vector<uint8_t> random_k_rows(int qtype, int64_t n, int64_t k, int64_t row_bytes, std::mt19937& rng) {
  const std::vector<int> scales = qtype == kQ6_K ? std::vector<int>{208} : std::vector<int>{0, 2};
  return random_scaled_rows(n, row_bytes, k / 256, gguf_kquant_bytes(qtype), scales, rng);
}

// The K-quant linear (m = 1: the vector-layer row dots; m > 1: decoded panels) vs x . w in double, w from
// gguf_kquant_dequant (the decode the Python tests hold bit-exact to gguf-py).
void run_k(int qtype, int64_t m, int64_t n, int64_t k, std::mt19937& rng, const char* isa) {
  const int64_t row_bytes = k / 256 * gguf_kquant_bytes(qtype) + 6;
  const std::vector<uint8_t> raw = random_k_rows(qtype, n, k, row_bytes, rng);
  std::vector<float> w(n * k);
  gguf_kquant_dequant({qtype, raw.data(), row_bytes, n, k, w.data(), k, DType::F32});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k), y(m * n, -1.0f);
  for (auto& v : x) v = normal(rng);
  gguf_linear({qtype, x.data(), k, m, k, raw.data(), row_bytes, n, y.data(), n, DType::F32});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < n; ++r) {
      double want = 0.0, scale = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double t = double(x[i * k + c]) * w[r * k + c];
        want += t;
        scale += std::fabs(t);
      }
      if (!(std::fabs(y[i * n + r] - want) <= 1e-5 * scale + 1e-30)) {
        check::fail(std::string(isa) + " K-quant qtype " + std::to_string(qtype) + " m " + std::to_string(m) +
                    " n " + std::to_string(n) + " k " + std::to_string(k) + " [" + std::to_string(i) + ", " +
                    std::to_string(r) + "]: got " + std::to_string(y[i * n + r]) + " want " + std::to_string(want));
        return;
      }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  set_num_threads(2);
  return check::for_each_isa([&](const char* isa) {
    for (int qtype : {kQ4_0, kQ4_1, kQ8_0}) {
      for (bool bf16 : {false, true})
        for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 32}, {1, 131, 576}, {2, 9, 96},
                               {7, 6, 160}, {13, 3, 64}, {1, 67, 1536}, {16, 11, 128}, {4, 7, 32}})
          run(qtype, m, n, k, bf16, rng, isa);
      for (auto [rows, k] : {std::pair<int, int64_t>{4, 96}, {1, 32}, {3, 160}})
        decode_is_exact(qtype, rows, k, rng, isa);
    }
    for (int qtype : {kQ4_K, kQ5_K, kQ6_K})
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 5, 256}, {1, 67, 768}, {3, 9, 512}})
        run_k(qtype, m, n, k, rng, isa);
  });
}
