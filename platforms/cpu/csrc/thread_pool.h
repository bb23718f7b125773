// A persistent worker pool for the native CPU kernels. One pool per process, sized by
// ENGINE_NUM_THREADS (default: the CPUs this process may run on). Kernels split their work with
// parallel_for; the calling thread takes a share too, so a pool of N threads has N-1 workers.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace engine_cpu {

// Run fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, one chunk
// per thread at most; returns when all chunks are done. Nested calls run inline (serially).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

int num_threads();
void set_num_threads(int n);  // n >= 1; resizes the pool (not while a parallel_for is running)

// Runs body(t0, t1) over [0, tiles) on up to num_threads() threads, each worth at least `grain`
// tiles. Threads take small chunks from a shared counter instead of one fixed share each: a thread
// that runs slower (a core shared with another process, a smaller core) then takes fewer tiles,
// rather than making every other thread wait for its share.
template <typename Body>
void for_dynamic_chunks(int64_t tiles, int64_t grain, const Body& body) {
  const int64_t threads = std::min<int64_t>(num_threads(), tiles / std::max<int64_t>(grain, 1));
  if (threads <= 1) {
    body(0, tiles);
    return;
  }
  const int64_t step = std::max<int64_t>({1, grain, tiles / (16 * threads)});  // few enough to keep the counter cold
  std::atomic<int64_t> next{0};
  parallel_for(threads, 1, [&](int64_t, int64_t) {
    for (int64_t t0; (t0 = next.fetch_add(step, std::memory_order_relaxed)) < tiles;)
      body(t0, std::min(tiles, t0 + step));
  });
}

}  // namespace engine_cpu
