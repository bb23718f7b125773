// Shared-memory all-reduce between processes of one host (layout and protocol: shm_all_reduce.cpp).
#pragma once

#include <cstdint>

namespace engine_cpu {

// out = sum over the `world` ranks of each rank's x (numel elements; dtype 0 fp32, 1 bf16, 2 fp16), through the
// segment at base; gen is this call's sequence number, the same on every rank. Throws std::runtime_error when a
// rank does not arrive within timeout_s, std::invalid_argument when x does not fit a slot.
void shm_all_reduce(uint8_t* base, int rank, int world, int64_t slot_bytes, int64_t gen, const uint8_t* x, uint8_t* out,
                    int64_t numel, int dtype, double timeout_s);

// Steps 1-2 of every collective: copy nbytes of x (0: none) into this rank's slot of bank gen % 2, publish gen, wait
// for every rank to publish it. The slots of that bank then hold every rank's bytes until this rank's next call.
void shm_exchange(uint8_t* base, int rank, int world, int64_t slot_bytes, int64_t gen, const uint8_t* x,
                  int64_t nbytes, double timeout_s);

}  // namespace engine_cpu
