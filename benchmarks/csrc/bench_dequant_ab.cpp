// Same-process A/B timing of the GGUF dequantize (gguf_dequant), single thread, on every x86 ISA variant: the
// kernels of two source trees linked into one binary (the old one under another namespace), called alternately
// on the same buffers, minimum of N calls each; it also checks that both give the same bytes. Alternating in
// one process keeps load from other processes and the buffers' placement alike for both (separate binaries run
// one after the other differed by up to 20% between runs on the 2-core host). This one file is compiled three
// times (OLD, NEW = <tree>/platforms/cpu/csrc; every kernel source of each tree but module / bind_*):
//   F="-std=c++17 -O3 -ffp-contract=off"
//   for s in $(ls $OLD/*.cpp | grep -Ev '/(module|bind_[^/]*)\.cpp$'); do g++ $F -Dengine_cpu=old_cpu -I$OLD -c $s -o old_$(basename $s).o; done
//   for s in $(ls $NEW/*.cpp | grep -Ev '/(module|bind_[^/]*)\.cpp$'); do g++ $F -I$NEW -c $s -o new_$(basename $s).o; done
//   g++ $F -Dengine_cpu=old_cpu -DWRAP=old_ -I$OLD -c bench_dequant_ab.cpp -o wrap_old.o
//   g++ $F -DWRAP=new_ -I$NEW -c bench_dequant_ab.cpp -o wrap_new.o
//   g++ $F -c bench_dequant_ab.cpp -o main.o && g++ *.o -lpthread -o bench_dequant_ab && ./bench_dequant_ab 40
// Prints microseconds per call, old -> new, and the ratio.
#include <cstdint>

#ifdef WRAP
#include "gguf_dequant.h"
#include "isa.h"
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
extern "C" void CAT(WRAP, dequant)(int qtype, const uint8_t* src, int64_t ss, int64_t rows, int64_t cols, void* dst,
                                   int64_t ds, int bf16) {
  engine_cpu::gguf_dequant({qtype, src, ss, rows, cols, dst, ds, bf16 ? engine_cpu::DType::BF16 : engine_cpu::DType::F32});
}
extern "C" void CAT(WRAP, set_isa)(const char* name) { engine_cpu::set_isa(name); }
#else
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" void old_dequant(int, const uint8_t*, int64_t, int64_t, int64_t, void*, int64_t, int);
extern "C" void new_dequant(int, const uint8_t*, int64_t, int64_t, int64_t, void*, int64_t, int);
extern "C" void old_set_isa(const char*);
extern "C" void new_set_isa(const char*);

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 40;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> byte(0, 255), e(5, 12), m(0, 1023);
  // SmolLM2-135M gate/up (1536 x 576) and down (576 x 1536) weights, and 4096 x 4096 (64 MB of fp32 out).
  const std::pair<int64_t, int64_t> shapes[] = {{1536, 576}, {576, 1536}, {4096, 4096}};
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    old_set_isa(isa), new_set_isa(isa);
    for (int qtype : {2, 3, 8})
      for (int bf : {0, 1})
        for (auto [rows, cols] : shapes) {
          const int bb = qtype == 2 ? 18 : qtype == 3 ? 20 : 34;
          const int64_t rb = cols / 32 * bb;
          std::vector<uint8_t> raw(rows * rb);
          for (auto& x : raw) x = static_cast<uint8_t>(byte(rng));
          for (int64_t blk = 0; blk < rows * cols / 32; ++blk) {  // finite positive scales, as real weights have
            const uint16_t d = static_cast<uint16_t>((e(rng) << 10) | m(rng));
            const uint16_t mm = static_cast<uint16_t>((e(rng) << 10) | m(rng));
            std::memcpy(raw.data() + blk * bb, &d, 2);
            if (qtype == 3) std::memcpy(raw.data() + blk * bb + 2, &mm, 2);
          }
          std::vector<float> o1(rows * cols), o2(rows * cols);
          const int n = rows * cols > 4000000 ? std::max(4, reps / 8) : reps;
          double bo = 1e30, bn = 1e30;
          for (int i = 0; i < n; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            old_dequant(qtype, raw.data(), rb, rows, cols, o1.data(), cols, bf);
            const auto t1 = std::chrono::steady_clock::now();
            new_dequant(qtype, raw.data(), rb, rows, cols, o2.data(), cols, bf);
            const auto t2 = std::chrono::steady_clock::now();
            bo = std::min(bo, std::chrono::duration<double, std::micro>(t1 - t0).count());
            bn = std::min(bn, std::chrono::duration<double, std::micro>(t2 - t1).count());
          }
          const bool same = std::memcmp(o1.data(), o2.data(), rows * cols * (bf ? 2 : 4)) == 0;
          std::printf("%-6s %s %-4s %5lldx%-5lld %9.1f -> %9.1f us  %.2f%s\n", isa,
                      qtype == 2 ? "Q4_0" : qtype == 3 ? "Q4_1" : "Q8_0", bf ? "bf16" : "fp32", (long long)rows,
                      (long long)cols, bo, bn, bn / bo, same ? "" : "  OUTPUT DIFFERS");
        }
  }
}
#endif
