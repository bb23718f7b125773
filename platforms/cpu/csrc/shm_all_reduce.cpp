// All-reduce (sum) between the processes of one machine through a shared memory segment: the CPU's collective for
// tensor parallelism, where gloo over loopback TCP took 1.7 ms for a 2.3 KB tensor on a 2-core VM.
//
// Segment layout (engine/platforms/cpu/kernels/comm.py makes it): `world` arrival counters, one per 64-byte line
// (each followed by its rank's process id, so a waiting rank notices a rank that died instead of timing out), then
// two banks (by the call's parity) of `world` slots of `slot_bytes` each. A call with sequence number `gen` (the same
// on every rank: every rank makes the same calls in the same order):
//   1. copy x into this rank's slot of bank gen % 2, then publish gen in its counter (release);
//   2. wait until every counter reads >= gen (acquire);
//   3. out = slot 0 + slot 1 + ... in rank order, in fp32, rounded once to the dtype: the same bits on every rank.
// Two banks make one barrier per call enough: a rank can start call gen + 2 (bank gen % 2 again) only after every
// rank published gen + 1, that is after every rank finished reading call gen.
// Steps 1-2 alone are shm_exchange, which the broadcast and the all-gather use (their copies out of the slots are
// made by the caller before its next call, which the same two banks make safe); one sequence of gen numbers serves
// every collective of a group.

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "convert.h"
#include "shm_all_reduce.h"

#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <sys/types.h>
#endif

namespace engine_cpu {
namespace {

constexpr int64_t kLine = 64;

std::atomic<int64_t>* counter(uint8_t* base, int rank) {
  return reinterpret_cast<std::atomic<int64_t>*>(base + rank * kLine);
}

// The process id each rank wrote after its counter when the segment was set up (0: unknown).
int64_t rank_pid(const uint8_t* base, int rank) { return *reinterpret_cast<const int64_t*>(base + rank * kLine + 8); }

bool has_exited(int64_t pid) {
#if defined(__unix__) || defined(__APPLE__)
  return pid > 0 && kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH;
#else
  return false;
#endif
}

uint8_t* slot(uint8_t* base, int world, int64_t slot_bytes, int64_t gen, int rank) {
  return base + world * kLine + ((gen & 1) * world + rank) * slot_bytes;
}

float load_as_f32(const uint8_t* p, int64_t i, int dtype) {
  switch (dtype) {
    case 0: return reinterpret_cast<const float*>(p)[i];
    case 1: return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    default: return fp16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  }
}

void store_from_f32(uint8_t* p, int64_t i, float v, int dtype) {
  switch (dtype) {
    case 0: reinterpret_cast<float*>(p)[i] = v; break;
    case 1: reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: reinterpret_cast<uint16_t*>(p)[i] = f32_to_fp16(v); break;
  }
}

}  // namespace

void shm_exchange(uint8_t* base, int rank, int world, int64_t slot_bytes, int64_t gen, const uint8_t* x,
                  int64_t nbytes, double timeout_s) {
  if (nbytes > slot_bytes) throw std::invalid_argument("tensor larger than the shared slot");
  if (nbytes > 0) std::memcpy(slot(base, world, slot_bytes, gen, rank), x, nbytes);
  counter(base, rank)->store(gen, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    int64_t spins = 0;
    while (counter(base, r)->load(std::memory_order_acquire) < gen) {
      if (++spins > 256) {  // another rank may share this core: give it the core
        std::this_thread::yield();
        if ((spins & 1023) == 0) {
          if (has_exited(rank_pid(base, r)))
            throw std::runtime_error("rank " + std::to_string(r) + " (pid " + std::to_string(rank_pid(base, r)) +
                                     ") has exited: shared-memory collective " + std::to_string(gen) +
                                     " cannot complete");
          if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s)
            throw std::runtime_error("rank " + std::to_string(r) + " did not reach shared-memory collective " +
                                     std::to_string(gen) + " within " + std::to_string(timeout_s) + " s");
        }
      }
    }
  }
}

void shm_all_reduce(uint8_t* base, int rank, int world, int64_t slot_bytes, int64_t gen, const uint8_t* x, uint8_t* out,
                    int64_t numel, int dtype, double timeout_s) {
  const int64_t esize = dtype == 0 ? 4 : 2;
  shm_exchange(base, rank, world, slot_bytes, gen, x, numel * esize, timeout_s);
  std::vector<const uint8_t*> src(world);
  for (int r = 0; r < world; ++r) src[r] = slot(base, world, slot_bytes, gen, r);
  for (int64_t i = 0; i < numel; ++i) {
    float acc = load_as_f32(src[0], i, dtype);
    for (int r = 1; r < world; ++r) acc += load_as_f32(src[r], i, dtype);
    store_from_f32(out, i, acc, dtype);
  }
}

}  // namespace engine_cpu
