// Runs one kernel `iters` times on random data, for instruction counting under qemu
// (benchmarks/bench_cpu_insn_count.py): the difference between two iteration counts is the kernel's
// own dynamic instruction count, set-up excluded.
//   kernel_runner gguf_gemv ISA QTYPE N K ITERS      (QTYPE 2 = Q4_0, 3 = Q4_1, 8 = Q8_0; fp32 x)
//   kernel_runner fp16_gemv ISA 0 N K ITERS          (fp16 x, w and y)
// Prints a checksum of the output so the work cannot be optimised away.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "convert.h"
#include "gguf_dequant.h"
#include "fp16_linear.h"
#include "gguf_linear.h"
#include "isa.h"
#include "thread_pool.h"

using namespace engine_cpu;

int main(int argc, char** argv) {
  const std::string mode = argc == 7 ? argv[1] : "";
  if (mode != "gguf_gemv" && mode != "fp16_gemv") {
    std::fprintf(stderr, "usage: kernel_runner gguf_gemv|fp16_gemv ISA QTYPE N K ITERS\n");
    return 2;
  }
  set_num_threads(1);
  set_isa(argv[2]);
  const int qtype = std::atoi(argv[3]);
  const int64_t n = std::atoll(argv[4]), k = std::atoll(argv[5]), iters = std::atoll(argv[6]);
  if (mode == "fp16_gemv") {
    std::mt19937 rng(1);
    std::vector<uint16_t> x(k), w(n * k), y(n);
    for (auto& v : x) v = f32_to_fp16(static_cast<float>(rng() % 1000) / 1000.0f);
    for (auto& v : w) v = f32_to_fp16(static_cast<float>(rng() % 1000) / 1000.0f - 0.5f);
    for (int64_t i = 0; i < iters; ++i) fp16_linear({x.data(), k, w.data(), k, y.data(), n, 1, n, k});
    double sum = 0;
    for (uint16_t v : y) sum += fp16_to_f32(v);
    std::printf("checksum %g\n", sum);
    return 0;
  }
  const int bb = gguf_block_bytes(qtype);
  std::mt19937 rng(1);
  std::vector<uint8_t> w(n * (k / 32) * bb);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < n * k / 32; ++blk) {
    const uint16_t one = 0x3c00;  // fp16 1.0 scales (and minimums): finite values
    std::memcpy(w.data() + blk * bb, &one, 2);
    if (qtype == kQ4_1) std::memcpy(w.data() + blk * bb + 2, &one, 2);
  }
  std::vector<float> x(k), y(n);
  for (auto& v : x) v = static_cast<float>(rng() % 1000) / 1000.0f;
  fp16_lut();  // built before the counted iterations
  for (int64_t i = 0; i < iters; ++i)
    gguf_linear({qtype, x.data(), k, 1, k, w.data(), (k / 32) * bb, n, y.data(), n, DType::F32});
  double sum = 0;
  for (float v : y) sum += v;
  std::printf("checksum %g\n", sum);
  return 0;
}
