// The RISC-V attention tile: paged_attention_impl.h on VecRvv128 (vec_rvv.h), 4-lane vectors that
// clang lowers to RVV 1.0 at vl = 4: correct at any VLEN, not widened past 128 bits (the tile keeps
// arrays of vectors in registers, which the sizeless length-agnostic types cannot be).
#include "isa.h"

#ifdef ENGINE_RVV
#define ENGINE_VEC_FN
#include "paged_attention_impl.h"

namespace engine_cpu {
void attn_tile_rvv(const AttnTile& t) { attn_tile_dispatch<VecRvv128>(t); }
}  // namespace engine_cpu
#endif  // ENGINE_RVV
