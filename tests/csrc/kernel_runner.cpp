// Runs one kernel `iters` times on random data, for instruction counting under qemu
// (benchmarks/bench_cpu_insn_count.py): the difference between two iteration counts is the kernel's
// own dynamic instruction count, set-up excluded.
//   kernel_runner gguf_gemv ISA QTYPE N K ITERS      (QTYPE 2 = Q4_0, 3 = Q4_1, 8 = Q8_0; fp32 x)
//   kernel_runner fp16_gemv ISA 0 N K ITERS          (fp16 x, w and y)
//   kernel_runner small_op ISA OP N K ITERS          (OP 0 rms_norm, 1 silu_and_mul, 2 rotary neox; N rows or
//                                                     tokens of K values, fp32; rotary: K / 64 heads of 64)
//   kernel_runner attn_decode ISA DTYPE N K ITERS    (one query of 8 heads, 2 KV heads, head_dim K, context N;
//                                                     DTYPE 0 fp32, 1 bf16, 2 fp16)
// Prints a checksum of the output so the work cannot be optimised away.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "activation.h"
#include "convert.h"
#include "gguf_dequant.h"
#include "fp16_linear.h"
#include "gguf_linear.h"
#include "isa.h"
#include "paged_attention.h"
#include "rms_norm.h"
#include "rotary.h"
#include "thread_pool.h"

using namespace engine_cpu;

int main(int argc, char** argv) {
  const std::string mode = argc == 7 ? argv[1] : "";
  if (mode != "gguf_gemv" && mode != "fp16_gemv" && mode != "small_op" && mode != "attn_decode") {
    std::fprintf(stderr, "usage: kernel_runner gguf_gemv|fp16_gemv|small_op|attn_decode ISA QTYPE N K ITERS\n");
    return 2;
  }
  set_num_threads(1);
  set_isa(argv[2]);
  const int qtype = std::atoi(argv[3]);
  const int64_t n = std::atoll(argv[4]), k = std::atoll(argv[5]), iters = std::atoll(argv[6]);
  if (mode == "small_op" || mode == "attn_decode") {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const bool attn = mode == "attn_decode";
    const int64_t hq = 8, hk = 2, block = 16, blocks = (n + block - 1) / block;
    std::vector<float> x(attn ? blocks * block * hk * k : 2 * n * k), y(attn ? hq * k : 2 * n * k), w(2 * k + 2);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    std::vector<uint16_t> xh(x.size()), qh(hq * k), oh(hq * k);
    const DType dt = static_cast<DType>(qtype);
    for (size_t i = 0; i < x.size(); ++i) xh[i] = dt == DType::BF16 ? f32_to_bf16(x[i]) : f32_to_fp16(x[i]);
    std::vector<int32_t> table(blocks), len{static_cast<int32_t>(n)};
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(b);
    std::vector<int64_t> pos(n, 0);
    for (int64_t i = 0; i < iters; ++i) {
      if (attn) {
        PagedAttnArgs a{};
        const bool h16 = dt != DType::F32;
        a.q = h16 ? static_cast<const void*>(xh.data()) : x.data();  // the first cache rows double as the query
        a.k_cache = a.v_cache = a.q;
        a.block_tables = table.data(), a.bt_rows = 1, a.max_blocks = blocks, a.bt_stride0 = blocks, a.bt_stride1 = 1;
        a.seq_lens = len.data(), a.num_seqs = 1, a.out = h16 ? static_cast<void*>(oh.data()) : y.data();
        a.num_tokens = 1, a.hq = hq, a.hk = hk, a.head_dim = k, a.num_blocks = a.v_num_blocks = blocks;
        a.block_size = block, a.scale = 0.125f, a.dtype = dt;
        paged_attention(a);
      } else if (qtype == 0) {
        rms_norm({x.data(), k, nullptr, 0, w.data(), y.data(), k, nullptr, 0, n, k, 1e-6f, DType::F32});
      } else if (qtype == 1) {
        silu_and_mul({x.data(), 2 * k, y.data(), k, n, k, DType::F32});
      } else {
        rotary_embedding({pos.data(), n, x.data(), k, n, k / 64, y.data(), x.data() + n * k, 64, n, 1,
                          y.data() + n * k, w.data(), 1, 64, 64, true, DType::F32});
      }
    }
    double sum = 0;
    for (float v : y) sum += v;
    for (uint16_t v : oh) sum += dt == DType::BF16 ? bf16_to_f32(v) : fp16_to_f32(v);
    std::printf("checksum %g\n", sum);
    return 0;
  }
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
