// AVX-512 attention tile. Keys go 16 at a time (one score per lane): for each query row the 16
// dot products are accumulated as 16 vectors and reduced by one transpose-and-add tree (45
// shuffles/adds for 16 scores instead of 16 horizontal sums). The softmax keeps a per-lane running
// denominator and rescales only when a chunk beats the running max (rare after the first chunks),
// so the common path has no horizontal max or sum and no scalar exp. P.V shares each V row among
// up to 4 query rows. head_dim is a template parameter (NV vectors of 16) so the query row and the
// output accumulators stay in registers.
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

constexpr int kChunk = 16;

// Lane i of the result = the sum of the 16 lanes of v[i].
ENGINE_AVX512 inline __m512 reduce16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] of x = v[2i], y = v[2i+1]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: partial sums of v[4i .. 4i+3]
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // fold 128-bit lanes 2, 3 onto 0, 1
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

template <bool kBf16>
ENGINE_AVX512 inline __m512 ld(const void* p, int64_t i) {
  if (kBf16) return bf16x16_load(static_cast<const uint16_t*>(p) + i, 0xffff);
  return _mm512_loadu_ps(static_cast<const float*>(p) + i);
}

// acc[r0 .. r0+K) += p[r][tt] * V[tt] for tt < nt: V rows are loaded once for K query rows, whose
// K * NV accumulators stay in registers.
template <int NV, int K>
ENGINE_AVX512 inline void v_pass(float* acc, const float* pb, const float* vr, int64_t rs, int r0, int nt) {
  constexpr int D = NV * 16;
  __m512 av[K][NV];
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < NV; ++j) av[k][j] = _mm512_loadu_ps(acc + (r0 + k) * D + 16 * j);
  for (int tt = 0; tt < nt; ++tt) {
    __m512 w[K];
    for (int k = 0; k < K; ++k) w[k] = _mm512_set1_ps(pb[(r0 + k) * kChunk + tt]);
    const float* vp = vr + tt * rs;
    for (int j = 0; j < NV; ++j) {
      const __m512 v = _mm512_loadu_ps(vp + 16 * j);
      for (int k = 0; k < K; ++k) av[k][j] = _mm512_fmadd_ps(w[k], v, av[k][j]);
    }
  }
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(acc + (r0 + k) * D + 16 * j, av[k][j]);
}

template <int NV, bool kBf16>
ENGINE_AVX512 void tile(const AttnTile& t) {
  constexpr int D = NV * 16;
  constexpr int RB = NV <= 4 ? 4 : NV <= 8 ? 2 : 1;  // query rows per V pass
  const int G = t.G, R = t.nq * G;
  thread_local std::vector<float> scratch;
  thread_local std::vector<int> nrs;  // valid keys of each row in the current chunk
  const size_t need = size_t(R) * (2 * D + 2 * kChunk + 1) + 2 * size_t(kChunk) * D;
  if (scratch.size() < need) scratch.resize(need);
  if (nrs.size() < size_t(R)) nrs.resize(R);
  float* qf = scratch.data();
  float* acc = qf + size_t(R) * D;
  float* lv = acc + size_t(R) * D;  // per-lane partial softmax denominators, [R][16]
  float* pb = lv + size_t(R) * kChunk;  // scores, then probabilities, of the current chunk, [R][16]
  float* m = pb + size_t(R) * kChunk;
  float* kb = m + R;
  float* vb = kb + kChunk * D;
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) {
      _mm512_storeu_ps(qf + r * D + 16 * j, ld<kBf16>(t.q, (r / G) * t.q_stride + (r % G) * D + 16 * j));
      _mm512_storeu_ps(acc + r * D + 16 * j, _mm512_setzero_ps());
    }
    _mm512_storeu_ps(lv + r * kChunk, _mm512_setzero_ps());
    m[r] = -std::numeric_limits<float>::infinity();
  }
  const __m512 vscale = _mm512_set1_ps(t.scale), vninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());

  for (int64_t c = t.k_begin; c < t.k_end;) {
    const int64_t blk = c / t.block_size, off = c - blk * t.block_size;
    const int n = static_cast<int>(std::min<int64_t>({kChunk, t.k_end - c, t.block_size - off}));
    const int64_t base = int64_t(t.blocks[blk * t.blocks_stride]) * t.blk_stride + off * t.tok_stride + t.head_off;
    attn_prefetch_next(t, c + n, kChunk, kBf16 ? 2 : 4);
    const float *kr, *vr;
    int64_t rs;
    if (kBf16) {  // convert the chunk once; every query row then reads fp32 from L1
      const uint16_t* ks = static_cast<const uint16_t*>(t.k_cache) + base;
      const uint16_t* vs = static_cast<const uint16_t*>(t.v_cache) + base;
      for (int tt = 0; tt < n; ++tt)
        for (int j = 0; j < NV; ++j) {
          _mm512_storeu_ps(kb + tt * D + 16 * j, bf16x16_load(ks + tt * t.tok_stride + 16 * j, 0xffff));
          _mm512_storeu_ps(vb + tt * D + 16 * j, bf16x16_load(vs + tt * t.tok_stride + 16 * j, 0xffff));
        }
      kr = kb;
      vr = vb;
      rs = D;
    } else {
      kr = static_cast<const float*>(t.k_cache) + base;
      vr = static_cast<const float*>(t.v_cache) + base;
      rs = t.tok_stride;
    }
    // Three passes over the rows, so that the long dependency chains of different rows (reduce,
    // exp) overlap instead of serialising each row's chunk.
    for (int r = 0; r < R; ++r) {  // 1: scores
      const int64_t lim = std::min<int64_t>(t.pos0 + r / G + 1, t.k_end) - c;
      const int nr = nrs[r] = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(n, lim)));
      if (nr == 0) {
        _mm512_storeu_ps(pb + r * kChunk, _mm512_setzero_ps());
        continue;
      }
      __m512 qv[NV];
      for (int j = 0; j < NV; ++j) qv[j] = _mm512_loadu_ps(qf + r * D + 16 * j);
      __m512 part[kChunk];
      for (int tt = 0; tt < kChunk; ++tt) {
        if (tt < nr) {  // keys past nr are never read: they may lie past seq_len
          const float* kp = kr + tt * rs;
          __m512 s = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kp));
          for (int j = 1; j < NV; ++j) s = _mm512_fmadd_ps(qv[j], _mm512_loadu_ps(kp + 16 * j), s);
          part[tt] = s;
        } else {
          part[tt] = _mm512_setzero_ps();
        }
      }
      _mm512_storeu_ps(pb + r * kChunk, _mm512_mask_mov_ps(vninf, tail_mask(nr), _mm512_mul_ps(reduce16(part), vscale)));
    }
    for (int r = 0; r < R; ++r) {  // 2: online softmax; rescale only when a score beats the running max
      if (nrs[r] == 0) continue;
      const __mmask16 mk = tail_mask(nrs[r]);
      const __m512 s = _mm512_loadu_ps(pb + r * kChunk);
      if (_mm512_cmp_ps_mask(s, _mm512_set1_ps(m[r]), _CMP_GT_OQ)) {
        const float m_new = std::max(m[r], _mm512_reduce_max_ps(s));
        const __m512 corr = _mm512_set1_ps(std::exp(m[r] - m_new));  // 0 on the first chunk (m = -inf)
        for (int j = 0; j < NV; ++j)
          _mm512_storeu_ps(acc + r * D + 16 * j, _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + 16 * j), corr));
        _mm512_storeu_ps(lv + r * kChunk, _mm512_mul_ps(_mm512_loadu_ps(lv + r * kChunk), corr));
        m[r] = m_new;
      }
      const __m512 p = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(s, _mm512_set1_ps(m[r]))));
      _mm512_storeu_ps(lv + r * kChunk, _mm512_add_ps(_mm512_loadu_ps(lv + r * kChunk), p));
      _mm512_storeu_ps(pb + r * kChunk, p);
    }
    int r = 0;  // 3: acc += p V, RB rows per pass; rows past their nr have p = 0 there
    for (; r < R; r += RB) {
      const int k = std::min(RB, R - r);
      int nt = 0;
      for (int i = 0; i < k; ++i) nt = std::max(nt, nrs[r + i]);
      if (nt == 0) continue;
      if (k == RB) v_pass<NV, RB>(acc, pb, vr, rs, r, nt);
      else if (k == 3) v_pass<NV, 3>(acc, pb, vr, rs, r, nt);
      else if (k == 2) v_pass<NV, 2>(acc, pb, vr, rs, r, nt);
      else v_pass<NV, 1>(acc, pb, vr, rs, r, nt);
    }
    c += n;
  }

  for (int r = 0; r < R; ++r) {
    const float l = _mm512_reduce_add_ps(_mm512_loadu_ps(lv + r * kChunk));
    if (t.out == nullptr) {
      t.m[r] = m[r];
      t.l[r] = l;
      std::copy(acc + size_t(r) * D, acc + size_t(r + 1) * D, t.acc + size_t(r) * D);
      continue;
    }
    const __m512 vl = _mm512_set1_ps(l);
    const int64_t dst = (r / G) * t.out_stride + (r % G) * D;
    for (int j = 0; j < NV; ++j) {
      const __m512 v = _mm512_div_ps(_mm512_loadu_ps(acc + r * D + 16 * j), vl);
      if (kBf16) bf16x16_store(static_cast<uint16_t*>(t.out) + dst + 16 * j, v, 0xffff);
      else _mm512_storeu_ps(static_cast<float*>(t.out) + dst + 16 * j, v);
    }
  }
}

}  // namespace

void attn_tile_avx512(const AttnTile& t) {
  const bool bf = t.dtype == DType::BF16;
  switch (t.head_dim / 16) {
#define ENGINE_ATTN_CASE(nv) \
  case nv: return bf ? tile<nv, true>(t) : tile<nv, false>(t);
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
