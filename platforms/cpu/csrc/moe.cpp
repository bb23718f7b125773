// fused_moe driver (validation, routing, grouping by expert, threading; see moe.h) and the portable
// scalar kernels.
#include "moe.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "thread_pool.h"

namespace engine_cpu {
namespace {

// ---- scalar kernels ----------------------------------------------------------------------------
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

template <typename W>
void dot_scalar(const float* x, int64_t xs, int mt, const W* const* w, int64_t k, float* out) {
  for (int i = 0; i < mt; ++i) {
    const float* xi = x + i * xs;
    for (int j = 0; j < kMoePanel; ++j) {
      const W* wj = w[j];
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // partial sums: shorter dependency chains, smaller error
      for (int64_t c = 0; c < k; ++c) acc[c & 7] += xi[c] * to_f32(wj[c]);
      out[i * kMoePanel + j] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
}

MoeKernels kernels_for(Isa isa) {
  switch (isa) {
#ifdef ENGINE_X86
    case Isa::Avx512: return moe_kernels_avx512();
    case Isa::Avx2: return moe_kernels_avx2();
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return moe_kernels_neon();
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return moe_kernels_vsx();
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: return moe_kernels_rvv();
#endif
    default: return moe_kernels_scalar();
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("fused_moe: " + what);
}

// Work (multiply-adds) below which a chunk of items is not worth handing to another thread.
constexpr int64_t kMinChunkWork = 1 << 16;

// One chunk of tokens, grouped by expert: pair p (a token and one of its top_k slots) has the token
// pair_token[p] (chunk-relative) and routing weight pair_weight[p]; expert e owns pairs
// [offset[e], offset[e + 1]), in ascending token order. Its activations start at xoff[e] in x and
// hoff[e] in h: rows ([M, H], [M, I]) when mpad[e] == 0 (dot), else transposed ([H, mpad], [I, mpad]).
struct Scratch {
  std::vector<float> weight, pair_weight, x, h;
  std::vector<float> y;  // [pairs, H]: weight * expert output, in pair order
  std::vector<int64_t> ids, offset, pair_token, active, mpad, xoff, hoff;
  std::vector<int64_t> token_pairs;  // [n, top_k]: token t's pairs in ascending expert order
};

template <typename W>
void run_chunk(const MoeArgs& a, const MoeKernels& kern, int64_t t0, int64_t n, Scratch& s) {
  const int64_t H = a.hidden, I = a.inter, E = a.experts, K = a.top_k, pairs = n * K;
  const int64_t bytes = a.logits_dtype == DType::BF16 ? 2 : 4;
  const char* logits = static_cast<const char*>(a.logits) + t0 * a.logits_stride * bytes;
  s.weight.resize(pairs);
  s.ids.resize(pairs);
  parallel_for(n, std::max<int64_t>(1, 4096 / E), [&](int64_t r0, int64_t r1) {
    moe_route(logits + r0 * a.logits_stride * bytes, a.logits_stride, a.logits_dtype, r1 - r0, E, a.top_k,
              a.renormalize, s.weight.data() + r0 * K, s.ids.data() + r0 * K);
  });

  s.offset.assign(E + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) ++s.offset[s.ids[p] + 1];
  s.active.clear();
  s.mpad.assign(E, 0);
  s.xoff.assign(E, 0);
  s.hoff.assign(E, 0);
  int64_t xsize = 0, hsize = 0;
  std::vector<std::pair<int64_t, int64_t>> units;  // gather work: (expert, 16-token group or -1 for all rows)
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = s.offset[e + 1];
    s.offset[e + 1] += s.offset[e];
    if (m == 0) continue;
    s.active.push_back(e);
    const int64_t gemm_from = a.dtype == DType::BF16 ? kMoeGemmMinMBf16 : kMoeGemmMinM;
    if (kern.gemm != nullptr && m >= gemm_from) s.mpad[e] = (m + 15) / 16 * 16;
    const int64_t cols = s.mpad[e] ? s.mpad[e] : m;
    s.xoff[e] = xsize;
    s.hoff[e] = hsize;
    xsize += cols * H;
    hsize += cols * I;
    if (s.mpad[e] == 0) units.emplace_back(e, -1);
    for (int64_t g = 0; g < s.mpad[e] / 16; ++g) units.emplace_back(e, g);
  }
  s.pair_token.resize(pairs);
  s.pair_weight.resize(pairs);
  std::vector<int64_t> fill(s.offset.begin(), s.offset.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t q = fill[s.ids[p]]++;
    s.pair_token[q] = p / K;
    s.pair_weight[q] = s.weight[p];
  }
  s.token_pairs.resize(pairs);
  std::vector<int64_t> seen(n, 0);
  for (int64_t q = 0; q < pairs; ++q) s.token_pairs[s.pair_token[q] * K + seen[s.pair_token[q]]++] = q;

  // The experts' activations as fp32 (bf16 widens exactly), in the layout of their kernel.
  s.x.resize(xsize);
  s.h.resize(hsize);
  s.y.resize(pairs * H);
  auto x_row = [&](int64_t pair, float* dst) {  // pair's row of x as fp32
    const int64_t row = (t0 + s.pair_token[pair]) * a.x_stride;
    if (a.dtype == DType::F32) std::copy_n(static_cast<const float*>(a.x) + row, H, dst);
    else for (int64_t c = 0; c < H; ++c) dst[c] = bf16_to_f32(static_cast<const uint16_t*>(a.x)[row + c]);
  };
  parallel_for(static_cast<int64_t>(units.size()), std::max<int64_t>(1, 32768 / (16 * H)), [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> rows;
    for (int64_t u = u0; u < u1; ++u) {
      const auto [e, g] = units[u];
      const int64_t off = s.offset[e], m = s.offset[e + 1] - off, mpad = s.mpad[e];
      float* dst = s.x.data() + s.xoff[e];
      if (g < 0) {
        for (int64_t i = 0; i < m; ++i) x_row(off + i, dst + i * H);
        continue;
      }
      rows.assign(16 * H, 0.0f);  // 16 columns of x^T; the padding past M stays zero
      for (int64_t i = 0; i < 16 && g * 16 + i < m; ++i) x_row(off + g * 16 + i, rows.data() + i * H);
      for (int64_t c = 0; c < H; ++c)
        for (int64_t i = 0; i < 16; ++i) dst[c * mpad + g * 16 + i] = rows[i * H + c];
    }
  });

  // dot over the m rows of x (k apart) and `rows` weight rows from w (rs apart), in panels of 4
  // (rows past the end repeat the last one; their results are dropped): emit(i, j, x_i . w_j).
  auto dot_rows = [&](const float* x, int64_t m, const W* w, int64_t rs, int64_t rows, int64_t k, auto emit) {
    float tile[kMoeMaxMt * kMoePanel];
    for (int64_t j0 = 0; j0 < rows; j0 += kMoePanel) {
      const W* ptrs[kMoePanel];
      for (int j = 0; j < kMoePanel; ++j) ptrs[j] = w + std::min<int64_t>(j0 + j, rows - 1) * rs;
      for (int64_t m0 = 0; m0 < m; m0 += kMoeMaxMt) {
        const int mt = static_cast<int>(std::min<int64_t>(kMoeMaxMt, m - m0));
        if constexpr (std::is_same_v<W, float>) kern.dot_f32(x + m0 * k, k, mt, ptrs, k, tile);
        else kern.dot_bf16(x + m0 * k, k, mt, ptrs, k, tile);
        for (int i = 0; i < mt; ++i)
          for (int64_t j = j0; j < std::min<int64_t>(j0 + kMoePanel, rows); ++j)
            emit(m0 + i, j, tile[i * kMoePanel + j - j0]);
      }
    }
  };
  // gemm of `rows` weight rows from w (kMoeGemmRows, the last one repeated) against xt; bf16 widened first.
  auto gemm = [&](const W* w, int64_t rs, int64_t rows, int64_t k, const float* xt, int64_t mpad, float* out,
                  int64_t ldo) {
    thread_local std::vector<float> wide;
    const float* ptrs[kMoeGemmRows];
    for (int j = 0; j < kMoeGemmRows; ++j) {
      const W* row = w + std::min<int64_t>(j, rows - 1) * rs;
      if constexpr (std::is_same_v<W, float>) {
        ptrs[j] = row;
      } else {
        wide.resize(kMoeGemmRows * k);
        if (j < rows) kern.widen(row, wide.data() + j * k, k);
        ptrs[j] = wide.data() + std::min<int64_t>(j, rows - 1) * k;
      }
    }
    kern.gemm(xt, mpad, mpad, ptrs, k, out, ldo);
  };
  const W* w13 = static_cast<const W*>(a.w13);
  const W* w2 = static_cast<const W*>(a.w2);
  const int64_t n_active = static_cast<int64_t>(s.active.size());
  const int64_t avg_m = pairs / n_active;

  // Phase 1: h = silu(x @ gate^T) * (x @ up^T) per (expert, tile of intermediate rows).
  const int64_t tiles1 = (I + kMoeTile - 1) / kMoeTile;
  for_dynamic_chunks(n_active * tiles1, kMinChunkWork / (2 * kMoeTile * H * std::max<int64_t>(avg_m, 4)),
                     [&](int64_t it0, int64_t it1) {
    thread_local std::vector<float> gu;  // per row of the tile: gate values, then up values
    for (int64_t it = it0; it < it1; ++it) {
      const int64_t e = s.active[it / tiles1], i0 = it % tiles1 * kMoeTile, nd = std::min(kMoeTile, I - i0);
      const int64_t off = s.offset[e], m = s.offset[e + 1] - off, mpad = s.mpad[e];
      const float* xe = s.x.data() + s.xoff[e];
      const W* we = w13 + e * a.w13_expert_stride;
      if (mpad > 0) {
        gu.resize(kMoeTile * 2 * mpad);
        for (int half = 0; half < 2; ++half)
          for (int64_t j0 = 0; j0 < nd; j0 += kMoeGemmRows)
            gemm(we + (half * I + i0 + j0) * a.w13_row_stride, a.w13_row_stride,
                 std::min<int64_t>(kMoeGemmRows, nd - j0), H, xe, mpad, gu.data() + (2 * j0 + half) * mpad, 2 * mpad);
        kern.silu_mul({gu.data(), 2 * mpad, s.h.data() + s.hoff[e] + i0 * mpad, mpad, nd, mpad, DType::F32}, 0, nd);
        continue;
      }
      gu.resize(m * 2 * nd);
      for (int half = 0; half < 2; ++half)
        dot_rows(xe, m, we + (half * I + i0) * a.w13_row_stride, a.w13_row_stride, nd, H,
                 [&](int64_t i, int64_t j, float v) { gu[i * 2 * nd + half * nd + j] = v; });
      kern.silu_mul({gu.data(), 2 * nd, s.h.data() + s.hoff[e] + i0, I, m, nd, DType::F32}, 0, m);
    }
  });

  // Phase 2: y[pair, tile] = weight * (h @ w2^T) per (expert, tile of output rows).
  const int64_t tiles2 = (H + kMoeTile - 1) / kMoeTile;
  for_dynamic_chunks(n_active * tiles2, kMinChunkWork / (kMoeTile * I * std::max<int64_t>(avg_m, 4)),
                     [&](int64_t it0, int64_t it1) {
    thread_local std::vector<float> yt;
    for (int64_t it = it0; it < it1; ++it) {
      const int64_t e = s.active[it / tiles2], h0 = it % tiles2 * kMoeTile, nd = std::min(kMoeTile, H - h0);
      const int64_t off = s.offset[e], m = s.offset[e + 1] - off, mpad = s.mpad[e];
      const float* he = s.h.data() + s.hoff[e];
      const W* we = w2 + e * a.w2_expert_stride + h0 * a.w2_row_stride;
      float* y = s.y.data() + off * H + h0;
      if (mpad > 0) {
        yt.resize(kMoeTile * mpad);
        for (int64_t j0 = 0; j0 < nd; j0 += kMoeGemmRows)
          gemm(we + j0 * a.w2_row_stride, a.w2_row_stride, std::min<int64_t>(kMoeGemmRows, nd - j0), I, he, mpad,
               yt.data() + j0 * mpad, mpad);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nd; ++j) y[i * H + j] = s.pair_weight[off + i] * yt[j * mpad + i];
        continue;
      }
      dot_rows(he, m, we, a.w2_row_stride, nd, I,
               [&](int64_t i, int64_t j, float v) { y[i * H + j] = s.pair_weight[off + i] * v; });
    }
  });

  // out[t] = sum of t's y rows in ascending expert order (as the reference's index_add), rounded once.
  parallel_for(n, std::max<int64_t>(1, 16384 / (H * K)), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> sum;
    sum.resize(H);
    for (int64_t t = r0; t < r1; ++t) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t j = 0; j < K; ++j) {
        const float* y = s.y.data() + s.token_pairs[t * K + j] * H;
        for (int64_t c = 0; c < H; ++c) sum[c] += y[c];
      }
      if (a.dtype == DType::BF16) {
        uint16_t* dst = static_cast<uint16_t*>(a.out) + (t0 + t) * a.out_stride;
        for (int64_t c = 0; c < H; ++c) dst[c] = f32_to_bf16(sum[c]);
      } else {
        std::copy_n(sum.data(), H, static_cast<float*>(a.out) + (t0 + t) * a.out_stride);
      }
    }
  });
}

// Kept out of fused_moe: the unwinder of libgcc cannot step through a RISC-V frame whose size depends
// on the vector length (CFA from vlenb), so the frames an exception leaves must not spill RVV registers.
[[gnu::noinline]] void run_chunks(const MoeArgs& a) {
  const MoeKernels kern = kernels_for(current_isa());
  thread_local Scratch s;
  const int64_t chunk = std::max<int64_t>(1, kMoeChunkPairs / a.top_k);
  for (int64_t t0 = 0; t0 < a.tokens; t0 += chunk) {
    const int64_t n = std::min(chunk, a.tokens - t0);
    if (a.dtype == DType::BF16) run_chunk<uint16_t>(a, kern, t0, n, s);
    else run_chunk<float>(a, kern, t0, n, s);
  }
}

}  // namespace

MoeKernels moe_kernels_scalar() {
  return {dot_scalar<float>, dot_scalar<uint16_t>, nullptr, nullptr,
          [](const SiluMulArgs& a, int64_t r0, int64_t r1) { silu_and_mul_scalar(a, r0, r1); }};
}

void moe_route(const void* logits, int64_t logits_stride, DType logits_dtype, int64_t tokens, int64_t experts,
               int top_k, bool renormalize, float* weights, int64_t* ids) {
  std::vector<float> p(experts);
  std::vector<char> taken(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e)
      p[e] = logits_dtype == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(logits)[t * logits_stride + e])
                                         : static_cast<const float*>(logits)[t * logits_stride + e];
    const float mx = *std::max_element(p.begin(), p.end());
    float sum = 0.0f;
    for (float& v : p) sum += (v = std::exp(v - mx));
    for (float& v : p) v /= sum;
    std::fill(taken.begin(), taken.end(), 0);
    float kept = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      weights[t * top_k + j] = p[best];
      ids[t * top_k + j] = best;
      kept += p[best];
    }
    if (renormalize)
      for (int j = 0; j < top_k; ++j) weights[t * top_k + j] /= kept;
  }
}

void fused_moe(const MoeArgs& a) {
  require(a.tokens >= 0 && a.hidden > 0 && a.inter > 0 && a.experts > 0,
          "need tokens >= 0 and hidden, inter, experts > 0; got tokens=" + std::to_string(a.tokens) +
              ", hidden=" + std::to_string(a.hidden) + ", inter=" + std::to_string(a.inter) +
              ", experts=" + std::to_string(a.experts));
  require(a.top_k >= 1 && a.top_k <= a.experts, "top_k must be in [1, " + std::to_string(a.experts) +
                                                    "] (the number of experts), got " + std::to_string(a.top_k));
  require((a.dtype == DType::F32 || a.dtype == DType::BF16) &&
              (a.logits_dtype == DType::F32 || a.logits_dtype == DType::BF16),
          "x/weights and router logits must each be fp32 or bf16");
  require(a.x_stride >= a.hidden && a.out_stride >= a.hidden && a.logits_stride >= a.experts,
          "a row stride of x, out or router_logits is smaller than its row");
  require(a.w13_row_stride >= a.hidden && a.w2_row_stride >= a.inter && a.w13_expert_stride >= 0 &&
              a.w2_expert_stride >= 0,
          "w13 rows must be >= hidden and w2 rows >= inter elements apart (expert strides >= 0)");
  if (a.tokens == 0) return;
  require(a.x && a.w13 && a.w2 && a.logits && a.out, "a data pointer is null");
  run_chunks(a);
}

}  // namespace engine_cpu
