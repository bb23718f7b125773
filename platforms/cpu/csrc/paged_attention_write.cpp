// write_kv_cache: one memcpy per token and cache (rows are contiguous [Hk, D]); no ISA variants, the
// copy is all there is. Slots are all checked before the first write, so a bad slot changes nothing.
#include <cstring>
#include <stdexcept>
#include <string>

#include "paged_attention.h"

namespace engine_cpu {

void write_kv_cache(const KvWriteArgs& a) {
  if (a.value_tokens != a.tokens || a.slot_tokens != a.tokens)
    throw std::invalid_argument("write_kv_cache: key, value and slot_mapping disagree on the number of tokens (" +
                                std::to_string(a.tokens) + ", " + std::to_string(a.value_tokens) + ", " +
                                std::to_string(a.slot_tokens) + ")");
  if (a.num_slots != a.v_num_slots)
    throw std::invalid_argument("write_kv_cache: key and value caches differ in size");
  for (int64_t t = 0; t < a.tokens; ++t)
    if (a.slots[t] >= a.num_slots)
      throw std::invalid_argument("write_kv_cache: slot_mapping[" + std::to_string(t) + "] = " +
                                  std::to_string(a.slots[t]) + " is past the cache's " +
                                  std::to_string(a.num_slots) + " slots");
  const char* k = static_cast<const char*>(a.key);
  const char* v = static_cast<const char*>(a.value);
  char* kc = static_cast<char*>(a.k_cache);
  char* vc = static_cast<char*>(a.v_cache);
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t s = a.slots[t];
    if (s < 0) continue;
    std::memcpy(kc + s * a.row_bytes, k + t * a.row_bytes, a.row_bytes);
    std::memcpy(vc + s * a.row_bytes, v + t * a.row_bytes, a.row_bytes);
  }
}

}  // namespace engine_cpu
