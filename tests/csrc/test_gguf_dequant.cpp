// GGUF dequantization vs the format's definition, written out here element by element.
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
  std::vector<float> out(rows * cols, -1.0f);
  gguf_dequant({qtype, raw.data(), row_bytes, rows, cols, out.data(), cols, DType::F32});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float want = reference(qtype, raw.data() + r * row_bytes + (c / 32) * bb, static_cast<int>(c % 32));
      if (out[r * cols + c] != want) {
        check::fail(std::string(isa) + " qtype " + std::to_string(qtype) + " row " + std::to_string(r) + " col " +
                    std::to_string(c) + ": got " + std::to_string(out[r * cols + c]) + " want " + std::to_string(want));
        return;
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
  }, {"rvv", "vsx"});
}
