// The POWER attention tile: paged_attention_impl.h on the 4-lane VSX backend.
#include "isa.h"

#ifdef ENGINE_VSX
#define ENGINE_VEC_FN
#include "paged_attention_impl.h"

namespace engine_cpu {
void attn_tile_vsx(const AttnTile& t) { attn_tile_dispatch<VecVsx>(t); }
}  // namespace engine_cpu
#endif  // ENGINE_VSX
