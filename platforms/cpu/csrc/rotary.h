// rotary_embedding (RoPE), fp32 math, q/k in fp32, bf16 or fp16, cos_sin_cache fp32 [max_pos, rot_dim]
// (cos half, then sin half). Per head, the first rot_dim channels are rotated in pairs (neox: j and
// j + rot/2; GPT-J: 2j and 2j + 1) as (a*cos - b*sin, b*cos + a*sin), the rest copied. Products and
// the sum are rounded separately (no FMA), like the torch reference, so fp32 results match it bit
// for bit.
#pragma once

#include <cstdint>

#include "convert.h"
#include "isa.h"

namespace engine_cpu {

struct RotaryArgs {
  const int64_t* positions;
  int64_t tokens;
  const void* q;  // token t's q_heads * head_dim values are contiguous, q_stride elements apart
  int64_t q_stride, q_tokens, q_heads;
  void* q_out;  // contiguous [T, q_heads * head_dim]
  const void* k;
  int64_t k_stride, k_tokens, k_heads;
  void* k_out;
  const float* cos_sin;  // contiguous [max_pos, rot_dim]
  int64_t max_pos, rot_dim, head_dim;
  bool neox;
  DType dtype;
  // rotary_write_kv: with slots set, token t's rotated k goes to k_cache row slots[t] instead of k_out, and its v
  // (v_stride elements after token t - 1's) to v_cache row slots[t]; a slot < 0 skips the token's k and v. Rows
  // are k_heads * head_dim values.
  const int64_t* slots = nullptr;
  int64_t slot_tokens = 0;
  const void* v = nullptr;
  int64_t v_stride = 0, v_tokens = 0;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t num_slots = 0, v_num_slots = 0;
};

// Validates (positions and slots in range, shapes), then splits tokens over the thread pool.
void rotary_embedding(const RotaryArgs& a);

// One token: `heads` heads of x (contiguous) -> out. cos/sin: rot_dim/2 values each.
struct RotaryRow {
  const void* x;
  void* out;
  int64_t heads, head_dim, rot_dim;
  const float* cos;
  const float* sin;
  bool neox;
  DType dtype;
};

// One variant per ISA: rotary_impl.h instantiated by small_ops_<isa>.cpp.
void rotary_row_scalar(const RotaryRow& r);
#ifdef ENGINE_X86
void rotary_row_avx2(const RotaryRow& r);
void rotary_row_avx512(const RotaryRow& r);
#endif
#ifdef ENGINE_ARM64
void rotary_row_neon(const RotaryRow& r);
#endif
#ifdef ENGINE_VSX
void rotary_row_vsx(const RotaryRow& r);
#endif
#ifdef ENGINE_RVV
void rotary_row_rvv(const RotaryRow& r);
#endif

}  // namespace engine_cpu
