// rotary_embedding (and rotary_write_kv, the same loop writing k and v to the paged cache): validation, the split
// over tokens, and the dispatch to the current ISA's variant (rotary_impl.h).
#include "rotary.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "thread_pool.h"

namespace engine_cpu {
namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("rotary_embedding: " + what); }

// The KV write's arguments (rotary_write_kv), all checked before anything is written.
void check_kv_write(const RotaryArgs& a) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("rotary_write_kv: " + what); };
  if (a.slot_tokens != a.tokens || a.v_tokens != a.tokens)
    fail("positions, v and slot_mapping disagree on the number of tokens (" + std::to_string(a.tokens) + ", " +
         std::to_string(a.v_tokens) + ", " + std::to_string(a.slot_tokens) + ")");
  if (a.num_slots != a.v_num_slots) fail("key and value caches differ in size");
  for (int64_t t = 0; t < a.tokens; ++t)
    if (a.slots[t] >= a.num_slots)
      fail("slot_mapping[" + std::to_string(t) + "] = " + std::to_string(a.slots[t]) + " is past the cache's " +
           std::to_string(a.num_slots) + " slots");
}

}  // namespace

void rotary_embedding(const RotaryArgs& a) {
  if (a.dtype != DType::F32 && a.dtype != DType::BF16 && a.dtype != DType::F16)
    bad("dtype must be fp32, bf16 or fp16");
  if (a.q_tokens != a.tokens || a.k_tokens != a.tokens)
    bad("positions, q and k disagree on the number of tokens (" + std::to_string(a.tokens) + ", " +
        std::to_string(a.q_tokens) + ", " + std::to_string(a.k_tokens) + ")");
  if (a.rot_dim <= 0 || a.rot_dim % 2 || a.rot_dim > a.head_dim) bad("rot_dim must be even and in (0, head_dim]");
  for (int64_t t = 0; t < a.tokens; ++t)
    if (a.positions[t] < 0 || a.positions[t] >= a.max_pos)
      bad("positions[" + std::to_string(t) + "] = " + std::to_string(a.positions[t]) +
          " is outside the cos_sin_cache's " + std::to_string(a.max_pos) + " positions");
  if (a.slots != nullptr) check_kv_write(a);
  void (*fn)(const RotaryRow&) = rotary_row_scalar;
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: fn = rotary_row_avx512; break;
    case Isa::Avx2: fn = rotary_row_avx2; break;
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: fn = rotary_row_neon; break;
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: fn = rotary_row_vsx; break;
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: fn = rotary_row_rvv; break;
#endif
    default: break;
  }
  const int64_t es = a.dtype == DType::F32 ? 4 : 2, half = a.rot_dim / 2;
  const int64_t per_token = (a.q_heads + a.k_heads) * a.head_dim;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(per_token, 1));
  parallel_for(a.tokens, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = a.cos_sin + a.positions[t] * a.rot_dim;
      RotaryRow r{static_cast<const char*>(a.q) + t * a.q_stride * es,
                  static_cast<char*>(a.q_out) + t * a.q_heads * a.head_dim * es,
                  a.q_heads, a.head_dim, a.rot_dim, cs, cs + half, a.neox, a.dtype};
      fn(r);
      const int64_t row = a.k_heads * a.head_dim * es;
      r.x = static_cast<const char*>(a.k) + t * a.k_stride * es;
      r.heads = a.k_heads;
      if (a.slots == nullptr) {
        r.out = static_cast<char*>(a.k_out) + t * row;
      } else {  // rotary_write_kv: k rotated straight into its cache row, v copied beside it
        const int64_t s = a.slots[t];
        if (s < 0) continue;
        r.out = static_cast<char*>(a.k_cache) + s * row;
        std::memcpy(static_cast<char*>(a.v_cache) + s * row, static_cast<const char*>(a.v) + t * a.v_stride * es,
                    row);
      }
      fn(r);
    }
  });
}

}  // namespace engine_cpu
