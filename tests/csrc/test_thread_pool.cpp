// parallel_for covers [0, n) exactly once for every thread count and grain, nested calls included.
#include <atomic>
#include <vector>

#include "check.h"
#include "thread_pool.h"

using namespace engine_cpu;

int main() {
  std::mt19937 rng(check::seed());
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
      int64_t grain = std::uniform_int_distribution<int64_t>(1, 8)(rng);
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          hits[i]++;
          parallel_for(3, 1, [](int64_t, int64_t) {});  // nested: runs inline, must not deadlock
        }
      });
      for (int64_t i = 0; i < n; ++i)
        if (hits[i] != 1)
          check::fail("threads " + std::to_string(threads) + " n " + std::to_string(n) + ": item " +
                      std::to_string(i) + " ran " + std::to_string(hits[i].load()) + " times");
    }
  }
  std::printf("%d failure(s), seed %u\n", check::failures(), check::seed());
  return check::failures() ? 1 : 0;
}
