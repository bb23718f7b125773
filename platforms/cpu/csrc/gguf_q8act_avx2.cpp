// AVX2 kernels of the Q8-activation GGUF linear: the quantizer (each block's d and s stored 8 times), and
// gguf_q8act_impl.h's tile on VecAvx2: one block (32 int8) per vector, vpmaddubsw + vpmaddwd block dots.
#include "isa.h"

#ifdef ENGINE_X86
#include "simd_x86.h"
#define ENGINE_VEC_FN ENGINE_AVX2
#include "gguf_q8act_impl.h"

namespace engine_cpu {
namespace {

constexpr int kLanes = 8;

ENGINE_AVX2 void quantize(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int u = 0; u < 4; ++u) {
      v[u] = _mm256_loadu_ps(x + 32 * b + 8 * u);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[u]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float db = _mm_cvtss_f32(h) / 127.0f;
    const __m256 inv = _mm256_set1_ps(db > 0.0f ? 1.0f / db : 0.0f);
    __m256i qi[4], sum = _mm256_setzero_si256();
    for (int u = 0; u < 4; ++u) {
      qi[u] = _mm256_cvtps_epi32(_mm256_mul_ps(v[u], inv));  // half to even, |.| <= 127
      sum = _mm256_add_epi32(sum, qi[u]);
    }
    // Pack 32 lanes of int32 to int8 in order: packs interleave 128-bit halves, the permute undoes it.
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), p8);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    const float sb = db * static_cast<float>(_mm_cvtsi128_si32(t));
    _mm256_storeu_ps(d + kLanes * b, _mm256_set1_ps(db));
    _mm256_storeu_ps(s + kLanes * b, _mm256_set1_ps(sb / kLanes));
  }
}

}  // namespace

GgufQ8Kernels gguf_q8_kernels_avx2() {
  return {kLanes, kQ8TileRows<VecAvx2>, quantize, q8_tile_impl<VecAvx2, Q8Ops<VecAvx2>, kLanes>};
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
