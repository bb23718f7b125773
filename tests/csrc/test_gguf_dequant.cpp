// GGUF dequantization (fp32 and bf16 outputs, every ISA variant) vs the format's definition, written out
// here element by element, on fresh random blocks.
#include <cstring>
#include <vector>

#include "check.h"
#include "convert.h"
#include "gguf_dequant.h"

using namespace engine_cpu;

namespace {

uint16_t random_fp16_scale(std::mt19937& rng) {
  // A normal fp16 in [2^-10, 2^-2) of either sign: exponent 5..13, random mantissa.
  std::uniform_int_distribution<int> e(5, 12), m(0, 1023), s(0, 1);
  return static_cast<uint16_t>((s(rng) << 15) | (e(rng) << 10) | m(rng));
}

// Value of element j (0..31) of one block, straight from the format description.
float reference(int qtype, const uint8_t* b, int j) {
  uint16_t d16, m16;
  std::memcpy(&d16, b, 2);
  float d = fp16_to_f32(d16);
  if (qtype == kQ8_0) return static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  const uint8_t* q = b + (qtype == kQ4_0 ? 2 : 4);
  int nib = j < 16 ? (q[j] & 0x0F) : (q[j - 16] >> 4);
  if (qtype == kQ4_0) return static_cast<float>(nib - 8) * d;
  std::memcpy(&m16, b + 2, 2);
  float prod = static_cast<float>(nib) * d;  // the format: q*d, then + m (two roundings)
  return prod + fp16_to_f32(m16);
}

void run(int qtype, int64_t rows, int64_t cols, std::mt19937& rng, const char* isa) {
  int bb = gguf_block_bytes(qtype);
  int64_t nblocks = cols / 32, row_bytes = nblocks * bb;
  std::vector<uint8_t> raw(rows * row_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : raw) x = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      uint8_t* b = raw.data() + r * row_bytes + blk * bb;
      uint16_t d = random_fp16_scale(rng), m = random_fp16_scale(rng);
      std::memcpy(b, &d, 2);
      if (qtype == kQ4_1) std::memcpy(b + 2, &m, 2);
    }
  // Output rows padded past cols (dst_stride > cols): the padding must stay untouched.
  const int64_t ds = cols + 16;
  std::vector<float> out(rows * ds, -1.0f);
  std::vector<uint16_t> out16(rows * ds, 0xdead);
  gguf_dequant({qtype, raw.data(), row_bytes, rows, cols, out.data(), ds, DType::F32});
  gguf_dequant({qtype, raw.data(), row_bytes, rows, cols, out16.data(), ds, DType::BF16});
  const std::string where = std::string(isa) + " qtype " + std::to_string(qtype) + " " + std::to_string(rows) + "x" +
                            std::to_string(cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ds; ++c) {
      const float got = out[r * ds + c];
      const uint16_t got16 = out16[r * ds + c];
      if (c >= cols) {
        if (got != -1.0f || got16 != 0xdead)
          return check::fail(where + ": wrote past cols in row " + std::to_string(r));
        continue;
      }
      float want = reference(qtype, raw.data() + r * row_bytes + (c / 32) * bb, static_cast<int>(c % 32));
      if (got != want) {
        return check::fail(where + " fp32 row " + std::to_string(r) + " col " + std::to_string(c) + ": got " +
                           std::to_string(got) + " want " + std::to_string(want));
      }
      if (got16 != f32_to_bf16(want)) {
        return check::fail(where + " bf16 row " + std::to_string(r) + " col " + std::to_string(c) + ": got 0x" +
                           std::to_string(got16) + " want bits of bf16(" + std::to_string(want) + ")");
      }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(check::seed());
  return check::for_each_isa([&](const char* isa) {
    for (int qtype : {kQ4_0, kQ4_1, kQ8_0})
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 32}, {3, 64}, {7, 576}, {5, 1536}})
        run(qtype, rows, cols, rng, isa);
  }, {"rvv"});  // RVV runs the portable path
}
