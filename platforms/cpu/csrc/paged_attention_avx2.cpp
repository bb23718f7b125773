// The AVX2 attention tile: paged_attention_impl.h on the 8-lane backend.
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "paged_attention_impl.h"

namespace engine_cpu {
void attn_tile_avx2(const AttnTile& t) { attn_tile_dispatch<VecAvx2>(t); }
}  // namespace engine_cpu
#endif  // ENGINE_X86
