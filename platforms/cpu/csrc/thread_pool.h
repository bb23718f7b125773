// A persistent worker pool for the native CPU kernels. One pool per process, sized by
// ENGINE_NUM_THREADS (default: the CPUs this process may run on). Kernels split their work with
// parallel_for; the calling thread takes a share too, so a pool of N threads has N-1 workers.
#pragma once

#include <cstdint>
#include <functional>

namespace engine_cpu {

// Run fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, one chunk
// per thread at most; returns when all chunks are done. Nested calls run inline (serially).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

int num_threads();
void set_num_threads(int n);  // n >= 1; resizes the pool (not while a parallel_for is running)

}  // namespace engine_cpu
