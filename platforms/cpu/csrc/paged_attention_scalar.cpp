// The portable attention tile: paged_attention_impl.h on the portable backend (four plain floats), the
// path of hosts without a vector backend and of the forced `scalar` ISA.
#define ENGINE_VEC_FN
#include "paged_attention_impl.h"

namespace engine_cpu {
void attn_tile_scalar(const AttnTile& t) { attn_tile_dispatch<VecScalar>(t); }
}  // namespace engine_cpu
