// The attention tile, written once against the vector layer (vec.h) and instantiated per ISA by
// paged_attention_{scalar,avx2,avx512,neon,vsx,rvv}.cpp, which define ENGINE_VEC_FN (the backend's target
// attribute) and include this file.
//
// Keys go W at a time (one score per lane): for each query row the W dot products are accumulated as W
// vectors and reduced by one transpose-and-add tree (V::transpose_add) instead of W horizontal sums.
// The softmax keeps a per-lane running denominator and rescales only when a chunk beats the running
// max (rare after the first chunks), so the common path has no horizontal max or sum and no scalar exp.
// P.V shares each V row among up to V::kMaxRows query rows. head_dim is a template parameter (NV
// vectors of W) so the query row and the output accumulators stay in registers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "paged_attention.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN (the backend's target attribute, or nothing) before including paged_attention_impl.h"
#endif

namespace engine_cpu {
namespace {

template <class V, DType D>
ENGINE_VEC_FN inline typename V::F attn_ld(const void* p, int64_t i) {
  if constexpr (D == DType::BF16) return V::load_bf16(static_cast<const uint16_t*>(p) + i);
  else if constexpr (D == DType::F16) return V::load_fp16(static_cast<const uint16_t*>(p) + i);
  else return V::load(static_cast<const float*>(p) + i);
}

// acc[r0 .. r0+K) += p[r][tt] * V[tt] for tt < nt: V rows are loaded once for K query rows, whose
// K * NV accumulators stay in registers.
template <class V, int NV, int K>
ENGINE_VEC_FN inline void attn_v_pass(float* acc, const float* pb, const float* vr, int64_t rs, int r0, int nt) {
  using F = typename V::F;
  constexpr int W = V::W, D = NV * W;
  F av[K][NV];
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < NV; ++j) av[k][j] = V::load(acc + (r0 + k) * D + W * j);
  for (int tt = 0; tt < nt; ++tt) {
    F w[K];
    for (int k = 0; k < K; ++k) w[k] = V::set1(pb[(r0 + k) * W + tt]);
    const float* vp = vr + tt * rs;
    for (int j = 0; j < NV; ++j) {
      const F v = V::load(vp + W * j);
      for (int k = 0; k < K; ++k) av[k][j] = V::fma(w[k], v, av[k][j]);
    }
  }
  for (int k = 0; k < K; ++k)
    for (int j = 0; j < NV; ++j) V::store(acc + (r0 + k) * D + W * j, av[k][j]);
}

// Query rows per V pass: the most (up to kMaxRows) whose accumulators fit the backend's budget.
template <class V, int NV>
constexpr int attn_rows_per_pass() {
  int rb = V::kMaxRows;
  while (rb > 1 && rb * NV > V::kAccRegs) rb /= 2;
  return rb;
}

template <class V, int NV, DType kDt>
ENGINE_VEC_FN void attn_tile_impl(const AttnTile& t) {
  using F = typename V::F;
  constexpr int W = V::W, kChunk = V::W, D = NV * W;
  constexpr int RB = attn_rows_per_pass<V, NV>();
  const int G = t.G, R = t.nq * G;
  thread_local std::vector<float> scratch;
  thread_local std::vector<int> nrs;  // valid keys of each row in the current chunk
  const size_t need = size_t(R) * (2 * D + 2 * kChunk + 1) + 2 * size_t(kChunk) * D;
  if (scratch.size() < need) scratch.resize(need);
  if (nrs.size() < size_t(R)) nrs.resize(R);
  float* qf = scratch.data();
  float* acc = qf + size_t(R) * D;
  float* lv = acc + size_t(R) * D;      // per-lane partial softmax denominators, [R][W]
  float* pb = lv + size_t(R) * kChunk;  // scores, then probabilities, of the current chunk, [R][W]
  float* m = pb + size_t(R) * kChunk;
  float* kb = m + R;
  float* vb = kb + kChunk * D;
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) {
      V::store(qf + r * D + W * j, attn_ld<V, kDt>(t.q, (r / G) * t.q_stride + (r % G) * D + W * j));
      V::store(acc + r * D + W * j, V::zero());
    }
    V::store(lv + r * kChunk, V::zero());
    m[r] = -std::numeric_limits<float>::infinity();
  }
  const F vscale = V::set1(t.scale), vninf = V::set1(-std::numeric_limits<float>::infinity());
  constexpr int64_t kEs = kDt == DType::F32 ? 4 : 2, kRowBytes = D * kEs;
  const int64_t row_stride = t.tok_stride * kEs;
  const int rv = R > 1 ? 1 : 0;  // the query row during whose scores the next chunk's V rows are prefetched
  const AttnRows first = attn_rows(t, t.k_begin, kChunk, kEs);  // nothing to overlap with yet: one burst
  for (int i = 0; i < first.n; ++i) {
    attn_prefetch(first.k + i * row_stride, kRowBytes);
    attn_prefetch(first.v + i * row_stride, kRowBytes);
  }

  for (int64_t c = t.k_begin; c < t.k_end;) {
    const int64_t blk = c / t.block_size, off = c - blk * t.block_size;
    const int n = static_cast<int>(std::min<int64_t>({kChunk, t.k_end - c, t.block_size - off}));
    const int64_t base = int64_t(t.blocks[blk * t.blocks_stride]) * t.blk_stride + off * t.tok_stride + t.head_off;
    // The next chunk's rows are prefetched one row at a time between this chunk's score dot products (K rows
    // during query row 0's, V rows during row 1's), so the core computes while they are in flight: a burst of the
    // whole chunk's prefetches stalled it until they returned. Decode attention with the cache in DRAM ran 25-47%
    // faster (32 sequences x 30 layers, 2-core Zen 5, AVX-512 and forced AVX2, 2026-12-02).
    const AttnRows next = c + n < t.k_end ? attn_rows(t, c + n, kChunk, kEs) : t.after;
    const float *kr, *vr;
    int64_t rs;
    if constexpr (kDt != DType::F32) {  // convert the chunk once; every query row then reads fp32 from L1
      const uint16_t* ks = static_cast<const uint16_t*>(t.k_cache) + base;
      const uint16_t* vs = static_cast<const uint16_t*>(t.v_cache) + base;
      for (int tt = 0; tt < n; ++tt)
        for (int j = 0; j < NV; ++j) {
          V::store(kb + tt * D + W * j, attn_ld<V, kDt>(ks, tt * t.tok_stride + W * j));
          V::store(vb + tt * D + W * j, attn_ld<V, kDt>(vs, tt * t.tok_stride + W * j));
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
        V::store(pb + r * kChunk, V::zero());
        continue;
      }
      F qv[NV];
      for (int j = 0; j < NV; ++j) qv[j] = V::load(qf + r * D + W * j);
      F part[kChunk];
      for (int tt = 0; tt < kChunk; ++tt) {
        if (tt < next.n) {
          if (r == 0) attn_prefetch(next.k + tt * row_stride, kRowBytes);
          if (r == rv) attn_prefetch(next.v + tt * row_stride, kRowBytes);
        }
        if (tt < nr) {  // keys past nr are never read: they may lie past seq_len
          const float* kp = kr + tt * rs;
          F s = V::mul(qv[0], V::load(kp));
          for (int j = 1; j < NV; ++j) s = V::fma(qv[j], V::load(kp + W * j), s);
          part[tt] = s;
        } else {
          part[tt] = V::zero();
        }
      }
      V::store(pb + r * kChunk, V::keep_first(V::mul(V::transpose_add(part), vscale), nr, vninf));
    }
    for (int r = 0; r < R; ++r) {  // 2: online softmax; rescale only when a score beats the running max
      if (nrs[r] == 0) continue;
      const F s = V::load(pb + r * kChunk);
      if (V::any_gt(s, V::set1(m[r]))) {
        const float m_new = std::max(m[r], V::reduce_max(s));
        const F corr = V::set1(std::exp(m[r] - m_new));  // 0 on the first chunk (m = -inf)
        for (int j = 0; j < NV; ++j) V::store(acc + r * D + W * j, V::mul(V::load(acc + r * D + W * j), corr));
        V::store(lv + r * kChunk, V::mul(V::load(lv + r * kChunk), corr));
        m[r] = m_new;
      }
      const F p = V::keep_first(V::exp(V::sub(s, V::set1(m[r]))), nrs[r], V::zero());
      V::store(lv + r * kChunk, V::add(V::load(lv + r * kChunk), p));
      V::store(pb + r * kChunk, p);
    }
    for (int r = 0; r < R; r += RB) {  // 3: acc += p V, RB rows per pass; rows past their nr have p = 0 there
      const int k = std::min(RB, R - r);
      int nt = 0;
      for (int i = 0; i < k; ++i) nt = std::max(nt, nrs[r + i]);
      if (nt == 0) continue;
      if (k == RB) attn_v_pass<V, NV, RB>(acc, pb, vr, rs, r, nt);
      else if (RB > 3 && k == 3) attn_v_pass<V, NV, (RB > 3 ? 3 : 1)>(acc, pb, vr, rs, r, nt);
      else if (RB > 2 && k == 2) attn_v_pass<V, NV, (RB > 2 ? 2 : 1)>(acc, pb, vr, rs, r, nt);
      else
        for (int i = 0; i < k; ++i) attn_v_pass<V, NV, 1>(acc, pb, vr, rs, r + i, nrs[r + i]);
    }
    c += n;
  }

  for (int r = 0; r < R; ++r) {
    const float l = V::reduce_add(V::load(lv + r * kChunk));
    if (t.out == nullptr) {
      t.m[r] = m[r];
      t.l[r] = l;
      std::copy(acc + size_t(r) * D, acc + size_t(r + 1) * D, t.acc + size_t(r) * D);
      continue;
    }
    const F vl = V::set1(l);
    const int64_t dst = (r / G) * t.out_stride + (r % G) * D;
    for (int j = 0; j < NV; ++j) {
      const F v = V::div(V::load(acc + r * D + W * j), vl);
      if constexpr (kDt == DType::BF16) V::store_bf16(static_cast<uint16_t*>(t.out) + dst + W * j, v);
      else if constexpr (kDt == DType::F16) V::store_fp16(static_cast<uint16_t*>(t.out) + dst + W * j, v);
      else V::store(static_cast<float*>(t.out) + dst + W * j, v);
    }
  }
}

// head_dim / 16 picks NV = head_dim / W (head_dim is a multiple of 16 in [16, 256] or MLA's 576, validated); the
// storage dtype (fp32, bf16, fp16) the loads and stores.
template <class V>
ENGINE_VEC_FN void attn_tile_dispatch(const AttnTile& t) {
  constexpr int P = 16 / V::W;  // vectors per 16 elements
  constexpr DType B = DType::BF16, H = DType::F16, S = DType::F32;
  switch (t.head_dim / 16) {
#define ENGINE_ATTN_CASE(n16)                                                          \
  case n16:                                                                            \
    return t.dtype == B ? attn_tile_impl<V, P * n16, B>(t)                             \
           : t.dtype == H ? attn_tile_impl<V, P * n16, H>(t) : attn_tile_impl<V, P * n16, S>(t);
    ENGINE_ATTN_CASE(1) ENGINE_ATTN_CASE(2) ENGINE_ATTN_CASE(3) ENGINE_ATTN_CASE(4)
    ENGINE_ATTN_CASE(5) ENGINE_ATTN_CASE(6) ENGINE_ATTN_CASE(7) ENGINE_ATTN_CASE(8)
    ENGINE_ATTN_CASE(9) ENGINE_ATTN_CASE(10) ENGINE_ATTN_CASE(11) ENGINE_ATTN_CASE(12)
    ENGINE_ATTN_CASE(13) ENGINE_ATTN_CASE(14) ENGINE_ATTN_CASE(15) ENGINE_ATTN_CASE(16)
    ENGINE_ATTN_CASE(kAttnLatentDim / 16)
#undef ENGINE_ATTN_CASE
    default: break;  // unreachable: paged_attention() validated head_dim
  }
}

}  // namespace
}  // namespace engine_cpu
