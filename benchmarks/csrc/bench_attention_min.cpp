// Single-thread min-of-N timing of paged decode attention (SmolLM2 heads) on every x86 ISA variant, for
// before/after comparisons of the kernel sources: build it once against each tree and run them alternately:
//   g++ -std=c++17 -O3 -ffp-contract=off -I$SRC bench_attention_min.cpp $SRC/paged_attention*.cpp $SRC/isa.cpp \
//       $SRC/thread_pool.cpp -lpthread -o bench_$NAME      (SRC = <tree>/platforms/cpu/csrc)
//   ./bench_before 300; ./bench_after 300; ...   (the minimum resists load from other processes)
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <algorithm>
#include "convert.h"
#include "isa.h"
#include "paged_attention.h"
#include "thread_pool.h"
using namespace engine_cpu;
int main(int argc, char** argv) {
  set_num_threads(1);
  const int hq = 9, hk = 3, D = 64, block = 16;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0, 1);
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    set_isa(isa);
    for (int bf : {1, 0})
      for (auto [B, ctx] : {std::pair{1, 2048}, std::pair{8, 512}, std::pair{1, 100}}) {
        int mb = (ctx + block - 1) / block, nb = B * mb;
        std::vector<int32_t> table(B * mb);
        for (int i = 0; i < B * mb; ++i) table[i] = i;
        std::shuffle(table.begin(), table.end(), rng);
        size_t cache = size_t(nb) * block * hk * D;
        std::vector<float> k(cache), v(cache), q(B * hq * D), out(B * hq * D);
        for (auto& x : k) x = n(rng);
        for (auto& x : v) x = n(rng);
        for (auto& x : q) x = n(rng);
        std::vector<uint16_t> kb(cache), vb(cache), qb(q.size()), ob(q.size());
        for (size_t i = 0; i < cache; ++i) kb[i] = f32_to_bf16(k[i]), vb[i] = f32_to_bf16(v[i]);
        for (size_t i = 0; i < q.size(); ++i) qb[i] = f32_to_bf16(q[i]);
        std::vector<int32_t> seq(B, ctx);
        PagedAttnArgs a{};
        a.q = bf ? (const void*)qb.data() : q.data();
        a.k_cache = bf ? (const void*)kb.data() : k.data();
        a.v_cache = bf ? (const void*)vb.data() : v.data();
        a.block_tables = table.data(); a.bt_rows = B; a.max_blocks = mb; a.bt_stride0 = mb; a.bt_stride1 = 1;
        a.seq_lens = seq.data(); a.num_seqs = B; a.cu_seqlens_q = nullptr;
        a.out = bf ? (void*)ob.data() : out.data();
        a.num_tokens = B; a.hq = hq; a.hk = hk; a.head_dim = D; a.num_blocks = a.v_num_blocks = nb; a.block_size = block;
        a.scale = 0.125f; a.dtype = bf ? DType::BF16 : DType::F32;
        double best = 1e9;
        int reps = argc > 1 ? atoi(argv[1]) : 300;
        for (int r = 0; r < reps; ++r) {
          auto t0 = std::chrono::steady_clock::now();
          paged_attention(a);
          best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        printf("%-7s %s B=%d ctx=%d  min %.1f us\n", isa, bf ? "bf16" : "fp32", B, ctx, best);
      }
  }
}
