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
  // Many short runs back to back: workers wake late, find their run finished by the caller, and must
  // neither run a chunk twice nor take one from the next run.
  for (int threads : {2, 5}) {
    set_num_threads(threads);
    std::vector<std::atomic<int>> hits(16);
    for (int run = 0; run < 20000; ++run) {
      const int64_t n = 2 + run % 15;
      parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < 16; ++i) {
        if (hits[i] != (i < n ? 1 : 0)) {
          check::fail("threads " + std::to_string(threads) + " run " + std::to_string(run) + ": item " +
                      std::to_string(i) + " ran " + std::to_string(hits[i].load()) + " times");
          run = 20000;
        }
        hits[i] = 0;
      }
    }
  }
  std::printf("%d failure(s), seed %u\n", check::failures(), check::seed());
  return check::failures() ? 1 : 0;
}
