// Persistent pool: workers poll a generation counter for kSpin after their last chunk (a decode step
// issues hundreds of short kernels with Python in between, and a worker asleep when a kernel starts wakes
// too late to help with it), then sleep on a condition variable, so an idle engine burns no CPU. Chunks
// are claimed, not assigned: the caller runs every chunk no worker has claimed, so it never waits for a
// worker that has not started.
#include "thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace engine_cpu {
namespace {

// How long an idle worker polls for the next run before it sleeps. Long enough to bridge the gaps between
// the kernels of one decode step (the Python between two linears, an attention call: tens of microseconds;
// measured in issue 11, a worker that slept after 20000 bare polls, ~10-20 us, helped with almost none of a
// step's GEMVs), short enough that a finished step leaves the core within a fraction of a millisecond.
constexpr std::chrono::microseconds kSpin{100};

// Tells the core this is a spin-wait: the sibling hyperthread gets the pipeline, and leaving the loop does
// not cost a memory-order mis-speculation flush.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int default_threads() {
  if (const char* env = std::getenv("ENGINE_NUM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 1)
      throw std::invalid_argument(std::string("ENGINE_NUM_THREADS must be a whole number >= 1, got '") + env + "'");
    return static_cast<int>(v);
  }
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  explicit Pool(int n) { start(n); }
  ~Pool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    stop();
    start(n);
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    int64_t chunks = std::min<int64_t>({size(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)), kMaxChunks});
    if (chunks <= 1 || in_parallel_) {
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    remaining_.store(chunks, std::memory_order_relaxed);
    uint64_t g;
    {
      std::lock_guard<std::mutex> lk(mutex_);
      g = generation_.load(std::memory_order_relaxed) + 1;
      claim_.store(claim_word(g, chunks, 0), std::memory_order_release);  // before workers can see `g`
      generation_.store(g, std::memory_order_release);
    }
    cv_.notify_all();
    in_parallel_ = true;
    // The caller claims chunks too, so a worker that is slow to wake (asleep, or its core busy) costs no
    // waiting: whatever it has not claimed by the time the caller is free, the caller runs.
    claim_and_run(g);
    in_parallel_ = false;
    while (remaining_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    fn_ = nullptr;
  }

 private:
  static constexpr int64_t kMaxChunks = 0xffff;

  // claim_ packs the run's generation (low 32 bits), its chunk count and the next unclaimed chunk, so a
  // claim can never take a chunk of a run other than the one the claimant woke up for.
  static uint64_t claim_word(uint64_t gen, int64_t chunks, int64_t next) {
    return ((gen & 0xffffffffu) << 32) | (static_cast<uint64_t>(chunks) << 16) | static_cast<uint64_t>(next);
  }

  void claim_and_run(uint64_t gen) {
    uint64_t cur = claim_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t next = cur & 0xffff, chunks = (cur >> 16) & 0xffff;
      if ((cur >> 32) != (gen & 0xffffffffu) || next >= chunks) return;
      if (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;  // `cur` was reloaded
      do_chunk(static_cast<int64_t>(next));
      remaining_.fetch_sub(1, std::memory_order_acq_rel);
      cur = claim_.load(std::memory_order_acquire);
    }
  }

  void do_chunk(int64_t c) {
    int64_t begin = n_ * c / chunks_, end = n_ * (c + 1) / chunks_;
    if (begin < end) (*fn_)(begin, end);
  }

  // `seen` is the generation when the pool started the thread: a thread scheduled late must still
  // take part in work published after its creation.
  void worker(uint64_t seen) {
    in_parallel_ = true;
    for (;;) {
      uint64_t g = seen;
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        for (int i = 0; i < 32 && (g = generation_.load(std::memory_order_acquire)) == seen; ++i) cpu_relax();
        if (g != seen || quit_.load(std::memory_order_relaxed) || std::chrono::steady_clock::now() >= spin_until)
          break;
        // On a host with more runnable threads than cores, a poll that never yields takes its core from them,
        // and the scheduler charges that time to this process: its own calling thread then waits for a core.
        sched_yield();
      }
      if (quit_.load(std::memory_order_relaxed)) return;
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mutex_);
        cv_.wait(lk, [&] { return quit_.load() || generation_.load() != seen; });
        if (quit_.load()) return;
        g = generation_.load(std::memory_order_acquire);
      }
      seen = g;
      claim_and_run(g);
    }
  }

  void start(int n) {
    if (n < 1) throw std::invalid_argument("number of threads must be >= 1, got " + std::to_string(n));
    quit_.store(false);
    const uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, g] { worker(g); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mutex_);
      quit_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_, mutex_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> remaining_{0};
  std::atomic<bool> quit_{false};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunks_ = 0;
  static thread_local bool in_parallel_;
};

thread_local bool Pool::in_parallel_ = false;

Pool& pool() {
  static Pool p(default_threads());
  return p;
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  pool().run(n, grain, fn);
}

int num_threads() { return pool().size(); }

void set_num_threads(int n) { pool().resize(n); }

}  // namespace engine_cpu
