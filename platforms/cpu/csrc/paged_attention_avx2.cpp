// AVX2 attention tile: the AVX-512 algorithm (see paged_attention_avx512.cpp) with 8 keys per chunk,
// an 8-vector transpose-and-add tree, and lanes past the chunk's valid keys masked by compare.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "activation_exp_x86.h"
#include "paged_attention.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

constexpr int kChunk = 8;

// Lane i of the result = the sum of the 8 lanes of v[i].
ENGINE_AVX2 inline __m256 reduce8(const __m256* v) {
  __m256 a[4], b[2];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i)
    b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                         _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

ENGINE_AVX2 inline float hmax8(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

template <bool kBf16>
ENGINE_AVX2 inline __m256 ld(const void* p, int64_t i) {
  if (kBf16) return bf16x8_load(static_cast<const uint16_t*>(p) + i);
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

// acc[r0 .. r0+K) += p[r][tt] * V[tt] for tt < nt (V rows shared by K query rows).
template <int NV, int K>
ENGINE_AVX2 inline void v_pass(float* acc, const float* pb, const float* vr, int64_t rs, int r0, int nt) {
  constexpr int D = NV * 8;
  __m256 av[K][NV];
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < NV; ++j) av[k][j] = _mm256_loadu_ps(acc + (r0 + k) * D + 8 * j);
  for (int tt = 0; tt < nt; ++tt) {
    __m256 w[K];
    for (int k = 0; k < K; ++k) w[k] = _mm256_broadcast_ss(pb + (r0 + k) * kChunk + tt);
    const float* vp = vr + tt * rs;
    for (int j = 0; j < NV; ++j) {
      const __m256 v = _mm256_loadu_ps(vp + 8 * j);
      for (int k = 0; k < K; ++k) av[k][j] = _mm256_fmadd_ps(w[k], v, av[k][j]);
    }
  }
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(acc + (r0 + k) * D + 8 * j, av[k][j]);
}

template <int NV, bool kBf16>  // NV vectors of 8 per head
ENGINE_AVX2 void tile(const AttnTile& t) {
  constexpr int D = NV * 8;
  constexpr int RB = NV <= 4 ? 2 : 1;  // 16 ymm registers: RB * NV accumulators
  const int G = t.G, R = t.nq * G;
  thread_local std::vector<float> scratch;
  thread_local std::vector<int> nrs;
  const size_t need = size_t(R) * (2 * D + 2 * kChunk + 1) + 2 * size_t(kChunk) * D;
  if (scratch.size() < need) scratch.resize(need);
  if (nrs.size() < size_t(R)) nrs.resize(R);
  float* qf = scratch.data();
  float* acc = qf + size_t(R) * D;
  float* lv = acc + size_t(R) * D;      // per-lane partial softmax denominators, [R][8]
  float* pb = lv + size_t(R) * kChunk;  // scores, then probabilities, of the current chunk, [R][8]
  float* m = pb + size_t(R) * kChunk;
  float* kb = m + R;
  float* vb = kb + kChunk * D;
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) {
      _mm256_storeu_ps(qf + r * D + 8 * j, ld<kBf16>(t.q, (r / G) * t.q_stride + (r % G) * D + 8 * j));
      _mm256_storeu_ps(acc + r * D + 8 * j, _mm256_setzero_ps());
    }
    _mm256_storeu_ps(lv + r * kChunk, _mm256_setzero_ps());
    m[r] = -std::numeric_limits<float>::infinity();
  }
  const __m256 vscale = _mm256_set1_ps(t.scale), vninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);

  for (int64_t c = t.k_begin; c < t.k_end;) {
    const int64_t blk = c / t.block_size, off = c - blk * t.block_size;
    const int n = static_cast<int>(std::min<int64_t>({kChunk, t.k_end - c, t.block_size - off}));
    const int64_t base = int64_t(t.blocks[blk * t.blocks_stride]) * t.blk_stride + off * t.tok_stride + t.head_off;
    attn_prefetch_next(t, c + n, kChunk, kBf16 ? 2 : 4);
    const float *kr, *vr;
    int64_t rs;
    if (kBf16) {
      const uint16_t* ks = static_cast<const uint16_t*>(t.k_cache) + base;
      const uint16_t* vs = static_cast<const uint16_t*>(t.v_cache) + base;
      for (int tt = 0; tt < n; ++tt)
        for (int j = 0; j < NV; ++j) {
          _mm256_storeu_ps(kb + tt * D + 8 * j, bf16x8_load(ks + tt * t.tok_stride + 8 * j));
          _mm256_storeu_ps(vb + tt * D + 8 * j, bf16x8_load(vs + tt * t.tok_stride + 8 * j));
        }
      kr = kb;
      vr = vb;
      rs = D;
    } else {
      kr = static_cast<const float*>(t.k_cache) + base;
      vr = static_cast<const float*>(t.v_cache) + base;
      rs = t.tok_stride;
    }
    for (int r = 0; r < R; ++r) {  // 1: scores
      const int64_t lim = std::min<int64_t>(t.pos0 + r / G + 1, t.k_end) - c;
      const int nr = nrs[r] = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(n, lim)));
      if (nr == 0) {
        _mm256_storeu_ps(pb + r * kChunk, _mm256_setzero_ps());
        continue;
      }
      __m256 part[kChunk];
      const float* qp = qf + r * D;
      for (int tt = 0; tt < kChunk; ++tt) {
        if (tt < nr) {  // keys past nr are never read: they may lie past seq_len
          const float* kp = kr + tt * rs;
          __m256 s = _mm256_mul_ps(_mm256_loadu_ps(qp), _mm256_loadu_ps(kp));
          for (int j = 1; j < NV; ++j) s = _mm256_fmadd_ps(_mm256_loadu_ps(qp + 8 * j), _mm256_loadu_ps(kp + 8 * j), s);
          part[tt] = s;
        } else {
          part[tt] = _mm256_setzero_ps();
        }
      }
      const __m256 valid = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(nr)), _CMP_LT_OQ);
      _mm256_storeu_ps(pb + r * kChunk, _mm256_blendv_ps(vninf, _mm256_mul_ps(reduce8(part), vscale), valid));
    }
    for (int r = 0; r < R; ++r) {  // 2: online softmax; rescale only when a score beats the running max
      if (nrs[r] == 0) continue;
      const __m256 s = _mm256_loadu_ps(pb + r * kChunk);
      if (_mm256_movemask_ps(_mm256_cmp_ps(s, _mm256_set1_ps(m[r]), _CMP_GT_OQ))) {
        const float m_new = std::max(m[r], hmax8(s));
        const __m256 corr = _mm256_set1_ps(std::exp(m[r] - m_new));  // 0 on the first chunk (m = -inf)
        for (int j = 0; j < NV; ++j)
          _mm256_storeu_ps(acc + r * D + 8 * j, _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + 8 * j), corr));
        _mm256_storeu_ps(lv + r * kChunk, _mm256_mul_ps(_mm256_loadu_ps(lv + r * kChunk), corr));
        m[r] = m_new;
      }
      const __m256 valid = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(nrs[r])), _CMP_LT_OQ);
      const __m256 p = _mm256_and_ps(valid, exp256(_mm256_sub_ps(s, _mm256_set1_ps(m[r]))));
      _mm256_storeu_ps(lv + r * kChunk, _mm256_add_ps(_mm256_loadu_ps(lv + r * kChunk), p));
      _mm256_storeu_ps(pb + r * kChunk, p);
    }
    for (int r = 0; r < R; r += RB) {  // 3: acc += p V; rows past their nr have p = 0 there
      const int k = std::min(RB, R - r);
      int nt = 0;
      for (int i = 0; i < k; ++i) nt = std::max(nt, nrs[r + i]);
      if (nt == 0) continue;
      if (k == RB) v_pass<NV, RB>(acc, pb, vr, rs, r, nt);
      else v_pass<NV, 1>(acc, pb, vr, rs, r, nt);
    }
    c += n;
  }

  for (int r = 0; r < R; ++r) {
    const float l = hsum8(_mm256_loadu_ps(lv + r * kChunk));
    if (t.out == nullptr) {
      t.m[r] = m[r];
      t.l[r] = l;
      std::copy(acc + size_t(r) * D, acc + size_t(r + 1) * D, t.acc + size_t(r) * D);
      continue;
    }
    const __m256 vl = _mm256_set1_ps(l);
    const int64_t dst = (r / G) * t.out_stride + (r % G) * D;
    for (int j = 0; j < NV; ++j) {
      const __m256 v = _mm256_div_ps(_mm256_loadu_ps(acc + r * D + 8 * j), vl);
      if (kBf16) bf16x8_store(static_cast<uint16_t*>(t.out) + dst + 8 * j, v);
      else _mm256_storeu_ps(static_cast<float*>(t.out) + dst + 8 * j, v);
    }
  }
}

}  // namespace

void attn_tile_avx2(const AttnTile& t) {
  const bool bf = t.dtype == DType::BF16;
  switch (t.head_dim / 16) {
#define ENGINE_ATTN_CASE(n16) \
  case n16: return bf ? tile<2 * n16, true>(t) : tile<2 * n16, false>(t);
    ENGINE_ATTN_CASE(1) ENGINE_ATTN_CASE(2) ENGINE_ATTN_CASE(3) ENGINE_ATTN_CASE(4)
    ENGINE_ATTN_CASE(5) ENGINE_ATTN_CASE(6) ENGINE_ATTN_CASE(7) ENGINE_ATTN_CASE(8)
    ENGINE_ATTN_CASE(9) ENGINE_ATTN_CASE(10) ENGINE_ATTN_CASE(11) ENGINE_ATTN_CASE(12)
    ENGINE_ATTN_CASE(13) ENGINE_ATTN_CASE(14) ENGINE_ATTN_CASE(15) ENGINE_ATTN_CASE(16)
#undef ENGINE_ATTN_CASE
    default: return attn_tile_scalar(t);  // unreachable: paged_attention() validated head_dim
  }
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
