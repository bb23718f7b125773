// Packing GGUF rows into the interleaved layout of gguf_packed.h (and back), and the driver of the packed
// Q8-activation linear (ISA gate, quantizing x, threads over row groups, output rounding).
#include "gguf_packed.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_dequant.h"
#include "thread_pool.h"

#ifdef __linux__
#include <sys/mman.h>
#endif
#ifdef __SSE2__
#include <xmmintrin.h>
#endif

namespace engine_cpu {

namespace {

void check_pack_args(int qtype, int64_t n, int64_t k, const char* op) {
  if (qtype != kQ4_0 && qtype != kQ4_1 && qtype != kQ8_0)
    throw std::invalid_argument(std::string(op) + ": unsupported qtype " + std::to_string(qtype) +
                                "; supported: Q4_0=2, Q4_1=3, Q8_0=8");
  if (k <= 0 || k % 32 != 0 || n < 0)
    throw std::invalid_argument(std::string(op) + ": k must be a positive multiple of 32 and n >= 0");
}

// Copies one row's blocks between GGUF (`raw`) and its lane r of group `g`, in the direction of `to_packed`.
void move_row(int qtype, uint8_t* raw, uint8_t* g, int r, int64_t nb, bool to_packed) {
  const int bb = gguf_block_bytes(qtype), chunks = qtype == kQ8_0 ? 8 : 4, qoff = qtype == kQ4_1 ? 4 : 2;
  const int qb = gguf_packed_quant_bytes(qtype), pb = gguf_packed_pair_bytes(qtype);
  auto mv = [to_packed](uint8_t* raw_p, uint8_t* packed_p, size_t bytes) {
    if (to_packed) std::memcpy(packed_p, raw_p, bytes);
    else std::memcpy(raw_p, packed_p, bytes);
  };
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = raw + b * bb;
    uint8_t* pair = g + b / 2 * pb;
    const int j = static_cast<int>(b % 2);
    uint8_t* scales = pair + 2 * qb + (j * kPackRows + r) * 2;
    mv(blk, scales, 2);
    if (qtype == kQ4_1) mv(blk + 2, scales + 2 * kPackRows * 2, 2);
    for (int c = 0; c < chunks; ++c) mv(blk + qoff + 4 * c, pair + j * qb + c * 4 * kPackRows + 4 * r, 4);
  }
}

// Below this much work (weight bytes x rows of x, roughly) a chunk of groups stays on one thread.
constexpr int64_t kMinChunkWork = 1 << 14;
// First runs of groups per thread from kShrinkRunsFromRows rows of x (1, 2, 4 and 8 measured alike on the 2-core
// host; 4 leaves room for uneven threads). Below, one run per thread: there a call streams its weights, and each run
// start waits a DRAM round trip before the prefetchers have the stream (M = 1 decode layers 5-11% faster, M = 4 6%,
// than with 4 runs a thread; M = 32 2% slower; 30 layers from DRAM, Zen 5, 2026-12-02).
constexpr int64_t kRunsPerThread = 4;
// Bytes of weight a run streams at least (runs shrink towards the end of a call, down to this).
constexpr int64_t kMinRunBytes = 16 << 10;
// Rows of x from which runs shrink (M = 1 lost 3-4% with shrinking runs, M = 8 neither lost nor gained, M = 32
// gained 4% a layer; Zen 5, 2026-12-01).
constexpr int64_t kShrinkRunsFromRows = 16;

// Calls fn(g, first row, rows) for every 16-row group of y's n rows (group_bytes of weight each), threads claiming
// runs of consecutive groups: each run is one sequential stream for the hardware prefetchers (for_dynamic_chunks'
// finer chunks, interleaved between threads, read DRAM at half the rate, measured). Runs start at
// kRunsPerThread-th of a thread's share and shrink to half of what is left per thread (guided scheduling),
// down to kMinRunBytes: the threads then finish together though one started late (a worker waking up) or runs
// slower (a core shared with another process), which at many rows of x, long runs, left one thread waiting for the
// other's last run.
template <class Fn>
void for_group_runs(const GgufLinearArgs& a, int64_t group_bytes, Fn&& fn) {
  const int64_t groups = (a.n + kPackRows - 1) / kPackRows;
  const int64_t group_work = group_bytes * std::max<int64_t>(1, a.m / 2);
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(num_threads(), groups * group_work / kMinChunkWork));
  const auto run = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * kPackRows;
      fn(g, n0, static_cast<int>(std::min<int64_t>(kPackRows, a.n - n0)));
    }
  };
  if (threads <= 1) return run(0, groups);
  const int64_t runs = a.m < kShrinkRunsFromRows ? threads : kRunsPerThread * threads;
  const int64_t first = std::max<int64_t>(1, (groups + runs - 1) / runs);
  // At few rows of x a call streams its weights (and every run start costs), so its runs keep their length.
  const int64_t least = a.m < kShrinkRunsFromRows
                            ? first
                            : std::min(first, (kMinRunBytes + group_bytes - 1) / std::max<int64_t>(group_bytes, 1));
  std::atomic<int64_t> next{0};
  parallel_for(threads, 1, [&](int64_t, int64_t) {
    for (int64_t g0 = next.load(std::memory_order_relaxed); g0 < groups;) {
      const int64_t left = groups - g0;
      const int64_t size = std::min(left, std::max(least, std::min(first, (left + 2 * threads - 1) / (2 * threads))));
      if (!next.compare_exchange_weak(g0, g0 + size, std::memory_order_relaxed)) continue;  // g0 was reloaded
      run(g0, g0 + size);
      g0 = next.load(std::memory_order_relaxed);
    }
  });
}

bool have_packed_kernels(GgufPackedKernels* out) {
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512:
      if (out) *out = cpu_has_avx512_vnni() ? gguf_packed_kernels_avx512() : gguf_packed_kernels_avx2();
      return true;
    case Isa::Avx2:
      if (out) *out = gguf_packed_kernels_avx2();
      return true;
#endif
    case Isa::Scalar:
      if (out) *out = gguf_packed_kernels_scalar();
      return true;
    default: return false;
  }
}

// x's scale for tiles that decode Q4 nibbles in place (gguf_packed.h): element e of a block, nibble
// t = 2 (e % 4) + (e >= 16) of its packed lane, times 2^(-4t) (none for t = 7).
constexpr float nib_scale(int e) {
  const int t = 2 * (e % 4) + (e >= 16 ? 1 : 0);
  float v = 1.0f;
  for (int i = 0; i < (t < 7 ? 4 * t : 0); ++i) v *= 0.5f;
  return v;
}
constexpr float kNibScale[32] = {
    nib_scale(0),  nib_scale(1),  nib_scale(2),  nib_scale(3),  nib_scale(4),  nib_scale(5),  nib_scale(6),
    nib_scale(7),  nib_scale(8),  nib_scale(9),  nib_scale(10), nib_scale(11), nib_scale(12), nib_scale(13),
    nib_scale(14), nib_scale(15), nib_scale(16), nib_scale(17), nib_scale(18), nib_scale(19), nib_scale(20),
    nib_scale(21), nib_scale(22), nib_scale(23), nib_scale(24), nib_scale(25), nib_scale(26), nib_scale(27),
    nib_scale(28), nib_scale(29), nib_scale(30), nib_scale(31)};

bool have_packed_f32_kernels(GgufPackedF32Kernels* out) {
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512:
      if (out) *out = gguf_packed_f32_kernels_avx512();
      return true;
    case Isa::Avx2:
      if (out) *out = gguf_packed_f32_kernels_avx2();
      return true;
#endif
    case Isa::Scalar:
      if (out) *out = gguf_packed_f32_kernels_scalar();
      return true;
    default: return false;
  }
}

// One block (32 columns) of the tile rows of x (row i at x + i * xs) into the tile layout: t[j * mt + i] =
// x_i[j], times kNibScale[j] where scaled. 4 x 4 transposes on SSE: the row-by-row copy before (writes strided by
// mt) and its block sums took ~14 us for 32 rows of 576 on the calling thread alone, ~5% of a 32-row decode step's
// linear time; this loop order ~5 us, with the transposes ~2 us (Zen 5, measured 2026-12-01).
void tile_x_block(const float* x, int64_t xs, int mt, bool scaled, float* t) {
  int i0 = 0;
#ifdef __SSE2__
  for (; i0 + 4 <= mt; i0 += 4)
    for (int j = 0; j < 32; j += 4) {
      __m128 r0 = _mm_loadu_ps(x + i0 * xs + j), r1 = _mm_loadu_ps(x + (i0 + 1) * xs + j);
      __m128 r2 = _mm_loadu_ps(x + (i0 + 2) * xs + j), r3 = _mm_loadu_ps(x + (i0 + 3) * xs + j);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);  // r_c: column j + c of the 4 rows
      if (scaled) {
        r0 = _mm_mul_ps(r0, _mm_set1_ps(kNibScale[j]));
        r1 = _mm_mul_ps(r1, _mm_set1_ps(kNibScale[j + 1]));
        r2 = _mm_mul_ps(r2, _mm_set1_ps(kNibScale[j + 2]));
        r3 = _mm_mul_ps(r3, _mm_set1_ps(kNibScale[j + 3]));
      }
      _mm_storeu_ps(t + j * mt + i0, r0);
      _mm_storeu_ps(t + (j + 1) * mt + i0, r1);
      _mm_storeu_ps(t + (j + 2) * mt + i0, r2);
      _mm_storeu_ps(t + (j + 3) * mt + i0, r3);
    }
#endif
  for (int j = 0; j < 32; ++j) {
    const float f = scaled ? kNibScale[j] : 1.0f;  // x * 1 is x
    for (int i = i0; i < mt; ++i) t[j * mt + i] = x[i * xs + j] * f;
  }
}

// s[i] = the sum of the block's 32 values of row i: 8 partial sums (one short dependency chain per lane), then
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)).
void block_sums(const float* x, int64_t xs, int mt, float* s) {
  for (int i = 0; i < mt; ++i) {
    const float* r = x + i * xs;
    float p[8];
    for (int l = 0; l < 8; ++l) p[l] = (0.0f + r[l]) + r[8 + l];
    for (int l = 0; l < 8; ++l) p[l] = (p[l] + r[16 + l]) + r[24 + l];
    s[i] = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  }
}

}  // namespace

int64_t gguf_packed_group_bytes(int qtype, int64_t k) { return (k / 32 + 1) / 2 * gguf_packed_pair_bytes(qtype); }

int64_t gguf_packed_bytes(int qtype, int64_t n, int64_t k) {
  return (n + kPackRows - 1) / kPackRows * gguf_packed_group_bytes(qtype, k);
}

void gguf_pack(int qtype, const uint8_t* w, int64_t w_stride, int64_t n, int64_t k, uint8_t* out) {
  check_pack_args(qtype, n, k, "gguf_pack");
  const int64_t nb = k / 32, gb = gguf_packed_group_bytes(qtype, k);
  if (w_stride < nb * gguf_block_bytes(qtype)) throw std::invalid_argument("gguf_pack: w_stride is smaller than a row");
  const int64_t groups = (n + kPackRows - 1) / kPackRows;
  parallel_for(groups, std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(gb, 1)), [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      uint8_t* gp = out + g * gb;
      const int rows = static_cast<int>(std::min<int64_t>(kPackRows, n - g * kPackRows));
      // Padding rows and an odd block count's last block: zero quants and scales.
      if (rows < kPackRows || nb % 2) std::memset(gp, 0, static_cast<size_t>(gb));
      for (int r = 0; r < rows; ++r)
        move_row(qtype, const_cast<uint8_t*>(w + (g * kPackRows + r) * w_stride), gp, r, nb, true);
    }
  });
}

void gguf_unpack(int qtype, const uint8_t* packed, int64_t n, int64_t k, uint8_t* w, int64_t w_stride) {
  check_pack_args(qtype, n, k, "gguf_unpack");
  const int64_t nb = k / 32, gb = gguf_packed_group_bytes(qtype, k);
  if (w_stride < nb * gguf_block_bytes(qtype)) throw std::invalid_argument("gguf_unpack: w_stride is smaller than a row");
  for (int64_t i = 0; i < n; ++i)
    move_row(qtype, w + i * w_stride, const_cast<uint8_t*>(packed + i / kPackRows * gb), static_cast<int>(i % kPackRows),
             nb, false);
}

int64_t gguf_advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = (a + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t hi = (a + static_cast<uintptr_t>(std::max<int64_t>(bytes, 0))) & ~(kHuge - 1);
  if (hi > lo && madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) == 0) return static_cast<int64_t>(hi - lo);
#else
  (void)p, (void)bytes;
#endif
  return 0;
}

const char* gguf_packed_variant() {
  if (!have_packed_kernels(nullptr)) return "";
  switch (current_isa()) {
    case Isa::Avx512: return cpu_has_avx512_vnni() ? "avx512_vnni" : "avx2";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

void gguf_linear_q8act_packed(const GgufLinearArgs& a, const uint8_t* packed) {
  GgufPackedKernels kern;
  if (!have_packed_kernels(&kern)) return gguf_linear_q8act(a);
  check_gguf_linear_args(a, "gguf_linear_q8act_packed");
  if (packed == nullptr) throw std::invalid_argument("gguf_linear_q8act_packed: packed is null");
  if (a.m == 0 || a.n == 0) return;
  const int64_t k = a.k, m = a.m, nb = k / 32;

  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> dbuf, sbuf;
  thread_local std::vector<int32_t> ibuf;
  // Workers see their own thread_local buffers: hand them this thread's by address.
  int8_t* qp = aligned64(qbuf, static_cast<size_t>(m * k));
  float* dp = aligned64(dbuf, static_cast<size_t>(m * nb));
  float* sp = aligned64(sbuf, static_cast<size_t>(m * nb));
  int32_t* ip = aligned64(ibuf, static_cast<size_t>(m * nb));
  parallel_for(m, std::max<int64_t>(1, 8192 / k), [&](int64_t r0, int64_t r1) {
    std::vector<float> row;
    for (int64_t i = r0; i < r1; ++i) {
      const float* xr = x_row_f32(a, i, row);
      kern.quantize(xr, k, qp + i * k, dp + i * nb, sp + i * nb);
      for (int64_t b = 0; b < nb; ++b) {
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += qp[i * k + 32 * b + j];
        ip[i * nb + b] = sum;
      }
    }
  });
  const PackedX xq{qp, dp, sp, ip, k};

  const int64_t gb = gguf_packed_group_bytes(a.qtype, k);
  for_group_runs(a, gb, [&](int64_t g, int64_t n0, int rows) {
    alignas(64) float tile[kPackedMaxTileRows * kPackRows];
    for (int64_t m0 = 0; m0 < m; m0 += kern.max_mt) {
      const int mt = static_cast<int>(std::min<int64_t>(kern.max_mt, m - m0));
      kern.tile(a.qtype, packed + g * gb, xq, m0, mt, tile);
      store_y_tile(a, tile, kPackRows, m0, mt, n0, rows);
    }
  });
}

const char* gguf_packed_f32_variant() {
  if (!have_packed_f32_kernels(nullptr)) return "";
  switch (current_isa()) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

void gguf_linear_packed(const GgufLinearArgs& a, const uint8_t* packed) {
  GgufPackedF32Kernels kern;
  if (!have_packed_f32_kernels(&kern) || (a.m > kern.max_m && a.m < kern.dense_from)) return gguf_linear(a);
  check_gguf_linear_args(a, "gguf_linear_packed");
  if (a.m == 0 || a.n == 0) return;  // before the null check: an empty weight's copy may have no address
  if (packed == nullptr) throw std::invalid_argument("gguf_linear_packed: packed is null");
  const int64_t k = a.k, m = a.m, nb = k / 32;

  // x tiled as PackedF32X says (widened exactly from bf16), with its block sums (Q4_1's minimum term and, without
  // a nibble table, Q4_0's -8 offset).
  // Where the tile reads Q4 nibbles in place (from scaled_from rows), x's element e of a block is scaled by
  // 2^(-4t) (exact but for |x| < 2^-102, whose scaled value is subnormal).
  // From kern.dense_from rows of x each group's weights are decoded once to fp32, then run through plain fp32
  // tiles (decode_group / dense_tile); below, the tile decodes in its loop, each decoded vector serving max_mt rows.
  const bool dense = m >= kern.dense_from;
  const int tile_rows = dense ? kern.dense_mt : kern.max_mt;
  const bool scaled = m >= kern.scaled_from && a.qtype != kQ8_0 && !dense;
  thread_local std::vector<float> xbuf, sbuf, wide;
  float* xt = aligned64(xbuf, static_cast<size_t>(m * k));
  float* st = aligned64(sbuf, static_cast<size_t>(m * nb));
  // One fp32 row unscaled is its own tile: no copy (a decode step's calls are a few microseconds each).
  const bool copy = m > 1 || a.dtype != DType::F32 || scaled || dense;
  const float* x = static_cast<const float*>(a.x);
  int64_t xs = a.x_stride;
  if (a.dtype == DType::BF16) {
    float* w = aligned64(wide, static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) {
      const uint16_t* s16 = static_cast<const uint16_t*>(a.x) + i * a.x_stride;
      for (int64_t c = 0; c < k; ++c) w[i * k + c] = bf16_to_f32(s16[c]);
    }
    x = w;
    xs = k;
  }
  // Threads split the blocks once a share is worth waking a worker for (~8K values).
  parallel_for(nb, std::max<int64_t>(1, 256 / m), [&](int64_t b0, int64_t b1) {
    for (int64_t m0 = 0; m0 < m; m0 += tile_rows) {
      const int mt = static_cast<int>(std::min<int64_t>(tile_rows, m - m0));
      const float* src = x + m0 * xs;
      for (int64_t b = b0; b < b1; ++b) {
        if (copy) tile_x_block(src + 32 * b, xs, mt, scaled, xt + m0 * k + 32 * b * mt);
        if (a.qtype != kQ8_0 && !dense) block_sums(src + 32 * b, xs, mt, st + m0 * nb + b * mt);
      }
    }
  });
  const PackedF32X xf{copy ? xt : x, st, k, scaled};

  const int64_t gb = gguf_packed_group_bytes(a.qtype, k);
  // Two loops, not one with a branch per tile: the single loop made AVX-512's 32-row calls 4-5% slower (three
  // same-process A/Bs, Zen 5, 2026-12-01).
  if (dense) {
    for_group_runs(a, gb, [&](int64_t g, int64_t n0, int rows) {
      thread_local std::vector<float> wbuf;
      float* w = aligned64(wbuf, static_cast<size_t>(k * kPackRows));
      kern.decode_group(a.qtype, packed + g * gb, nb, w);
      alignas(64) float tile[kPackedF32MaxTileRows * kPackRows];
      for (int64_t m0 = 0; m0 < m; m0 += tile_rows) {
        const int mt = static_cast<int>(std::min<int64_t>(tile_rows, m - m0));
        kern.dense_tile(w, k, xt + m0 * k, mt, tile);
        store_y_tile(a, tile, kPackRows, m0, mt, n0, rows);
      }
    });
    return;
  }
  for_group_runs(a, gb, [&](int64_t g, int64_t n0, int rows) {
    alignas(64) float tile[kPackedF32MaxTileRows * kPackRows];
    for (int64_t m0 = 0; m0 < m; m0 += kern.max_mt) {
      const int mt = static_cast<int>(std::min<int64_t>(kern.max_mt, m - m0));
      kern.tile(a.qtype, packed + g * gb, xf, m0, mt, tile);
      store_y_tile(a, tile, kPackRows, m0, mt, n0, rows);
    }
  });
}

}  // namespace engine_cpu
