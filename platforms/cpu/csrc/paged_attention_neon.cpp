// The AArch64 attention tile: paged_attention_impl.h on the 4-lane NEON backend.
#include "isa.h"

#ifdef ENGINE_ARM64
#define ENGINE_VEC_FN
#include "paged_attention_impl.h"

namespace engine_cpu {
void attn_tile_neon(const AttnTile& t) { attn_tile_dispatch<VecNeon>(t); }
}  // namespace engine_cpu
#endif  // ENGINE_ARM64
