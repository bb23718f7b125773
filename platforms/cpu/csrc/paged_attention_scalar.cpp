// Portable attention tile: the same chunked online softmax as the vector variants, in plain loops
// (the only path on non-x86 hosts, and the forced `scalar` ISA).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "paged_attention.h"

namespace engine_cpu {
namespace {

constexpr int kChunk = 16;  // keys per chunk; a chunk never crosses a cache block

template <bool kBf16>
inline float ld(const void* p, int64_t i) {
  if constexpr (kBf16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  else return static_cast<const float*>(p)[i];
}

template <bool kBf16>
void tile(const AttnTile& t) {
  const int G = t.G, D = t.head_dim, R = t.nq * G;
  thread_local std::vector<float> scratch;
  const size_t need = size_t(R) * D * 2 + 2 * size_t(R) + 2 * size_t(kChunk) * D + kChunk;
  if (scratch.size() < need) scratch.resize(need);
  float* qf = scratch.data();
  float* acc = qf + size_t(R) * D;
  float* m = acc + size_t(R) * D;
  float* l = m + R;
  float* kb = l + R;
  float* vb = kb + kChunk * D;
  float* s = vb + kChunk * D;
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < D; ++d) qf[r * D + d] = ld<kBf16>(t.q, (r / G) * t.q_stride + (r % G) * D + d);
  std::fill(acc, acc + size_t(R) * D, 0.0f);
  std::fill(m, m + R, -std::numeric_limits<float>::infinity());
  std::fill(l, l + R, 0.0f);

  for (int64_t c = t.k_begin; c < t.k_end;) {
    const int64_t blk = c / t.block_size, off = c - blk * t.block_size;
    const int n = static_cast<int>(std::min<int64_t>({kChunk, t.k_end - c, t.block_size - off}));
    const int64_t base = int64_t(t.blocks[blk * t.blocks_stride]) * t.blk_stride + off * t.tok_stride + t.head_off;
    for (int tt = 0; tt < n; ++tt)
      for (int d = 0; d < D; ++d) {
        kb[tt * D + d] = ld<kBf16>(t.k_cache, base + tt * t.tok_stride + d);
        vb[tt * D + d] = ld<kBf16>(t.v_cache, base + tt * t.tok_stride + d);
      }
    for (int r = 0; r < R; ++r) {
      const int64_t lim = std::min<int64_t>(t.pos0 + r / G + 1, t.k_end) - c;
      if (lim <= 0) continue;
      const int nr = static_cast<int>(std::min<int64_t>(n, lim));
      float mx = m[r];
      for (int tt = 0; tt < nr; ++tt) {
        float dot = 0;
        for (int d = 0; d < D; ++d) dot += qf[r * D + d] * kb[tt * D + d];
        s[tt] = dot * t.scale;
        mx = std::max(mx, s[tt]);
      }
      const float corr = std::exp(m[r] - mx);  // 0 on the first chunk (m = -inf)
      float sum = 0;
      for (int tt = 0; tt < nr; ++tt) sum += (s[tt] = std::exp(s[tt] - mx));
      l[r] = l[r] * corr + sum;
      m[r] = mx;
      float* ar = acc + size_t(r) * D;
      for (int d = 0; d < D; ++d) ar[d] *= corr;
      for (int tt = 0; tt < nr; ++tt)
        for (int d = 0; d < D; ++d) ar[d] += s[tt] * vb[tt * D + d];
    }
    c += n;
  }

  if (t.out == nullptr) {
    std::copy(m, m + R, t.m);
    std::copy(l, l + R, t.l);
    std::copy(acc, acc + size_t(R) * D, t.acc);
    return;
  }
  for (int r = 0; r < R; ++r) {
    const int64_t dst = (r / G) * t.out_stride + (r % G) * D;
    for (int d = 0; d < D; ++d) {
      const float v = acc[size_t(r) * D + d] / l[r];
      if constexpr (kBf16) static_cast<uint16_t*>(t.out)[dst + d] = f32_to_bf16(v);
      else static_cast<float*>(t.out)[dst + d] = v;
    }
  }
}

}  // namespace

void attn_tile_scalar(const AttnTile& t) {
  if (t.dtype == DType::BF16) tile<true>(t);
  else tile<false>(t);
}

}  // namespace engine_cpu
