// GGUF weights repacked once into a row-interleaved layout, and the Q8-activation linear on it (the same op as
// gguf_linear_q8act, gguf_q8act.h: x rounded to Q8 blocks by the same quantizer, integer block dots).
//
// Why: on raw GGUF rows a decode GEMV spends ~12 (AVX-512) to 22 (AVX2) instructions per 32-value block per row,
// 40% of them fetching and broadcasting the block's fp16 scale: instruction-bound. Interleaved, one vector load
// brings the same 4 bytes of a block from kPackRows rows (int32 lane r = row r), x's matching 4 bytes are
// broadcast to every lane, and one vcvtph2ps gives all the rows' scales: ~2 instructions per block per row.
//
// Layout: rows in groups of kPackRows = 16 (the last group padded with zero rows), groups gguf_packed_group_bytes
// apart. A group is one sequential stream of block pairs (so the hardware prefetchers see one long stream; three
// shorter ones per group, quants then scales, read at ~60% of the rate), each pair, 64-byte aligned:
//   qs  [2][C][16][4] bytes: chunk c of each of the two blocks holds bytes 4c .. 4c + 3 of each row's quants
//       (C = 4 for Q4_0 / Q4_1, whose byte j carries value j in its low nibble and value 16 + j in its high one;
//       C = 8 for Q8_0);
//   d   [2][16] fp16, the rows' block scales;
//   m   [2][16] fp16, Q4_1's block minimums (Q4_1 only).
// An odd block count leaves the last pair's second block zero. Per row and block that is exactly the GGUF
// block's bytes (18 / 20 / 34), plus one block per row for odd block counts. Scales stay fp16: one vcvtph2ps per
// 16 rows and block converts them (fp32 would add 10-20% bytes to a memory-bound stream for no instruction saved).
#pragma once

#include <cstdint>

#include "gguf_linear.h"
#include "gguf_q8act.h"

namespace engine_cpu {

constexpr int kPackRows = 16;
// Software prefetch distance of the packed tiles in the weight stream (a thread's run of groups is one sequential
// stream; the next run's start is not prefetched). The hardware prefetchers alone left a decode step's fp32 linears
// at ~30 GB/s of DRAM on the 2-core Zen 5; prefetching 4 KB ahead made M = 1 / 4 / 8 / 16 / 32 steps 19 / 16 / 15
// / 15 / 6% faster on AVX-512 and M = 1 / 8 23 / 14% on AVX2 (2026-12-01; 2 and 8 KB about as good, 512 B and
// 16 KB less).
constexpr int64_t kPackedPrefetchBytes = 4096;
// Bytes of one block's quants for a group, and of a block pair (quants, scales, Q4_1's minimums).
constexpr int gguf_packed_quant_bytes(int qtype) { return 4 * kPackRows * (qtype == 8 ? 8 : 4); }
constexpr int gguf_packed_pair_bytes(int qtype) {
  return 2 * gguf_packed_quant_bytes(qtype) + 2 * kPackRows * 2 * (qtype == 3 ? 2 : 1);
}

// Bytes of one group of kPackRows rows / of the whole packed weight (n rows of k columns).
int64_t gguf_packed_group_bytes(int qtype, int64_t k);
int64_t gguf_packed_bytes(int qtype, int64_t n, int64_t k);

// Raw GGUF rows (w_stride bytes apart) -> the layout above at `out` (gguf_packed_bytes(qtype, n, k) bytes), and
// back (padding rows dropped). Validate (std::invalid_argument); threads split the groups.
void gguf_pack(int qtype, const uint8_t* w, int64_t w_stride, int64_t n, int64_t k, uint8_t* out);
void gguf_unpack(int qtype, const uint8_t* packed, int64_t n, int64_t k, uint8_t* w, int64_t w_stride);

// Asks the OS to back [p, p + bytes) with huge pages (Linux madvise MADV_HUGEPAGE on the 2 MB pages inside it;
// untouched memory, before it is written): the packed kernels then stream DRAM ~8% faster (a decode step's
// weights, measured; fewer TLB misses and page ends for the prefetchers). Returns the bytes advised (0 elsewhere).
int64_t gguf_advise_huge_pages(void* p, int64_t bytes);

// The packed kernel variant for the current ISA: avx512_vnni, avx2 (also AVX-512 CPUs without VNNI) or scalar;
// "" where there is none (NEON, VSX, RVV keep gguf_linear_q8act's kernels).
const char* gguf_packed_variant();

// gguf_linear_q8act(a) with the weight read from `packed` (gguf_pack of a.w); where gguf_packed_variant() is
// "" (the ISA changed since packing), gguf_linear_q8act(a) on the raw rows. Same validation.
void gguf_linear_q8act_packed(const GgufLinearArgs& a, const uint8_t* packed);

// Quantized x as the packed tile reads it: q [m][k], d and s (= d * sum(q)) [m][nb], isum (= sum(q)) [m][nb].
struct PackedX {
  const int8_t* q;
  const float* d;
  const float* s;
  const int32_t* isum;
  int64_t k;
};

// Per-ISA kernels: quantize as gguf_q8act.h's with one scale per block; tile: out[i * 16 + r] = row x0 + i of x
// (i < mt <= max_mt <= kPackedMaxTileRows) . row r of the group at g (all 16 rows, padding included).
constexpr int kPackedMaxTileRows = 16;
struct GgufPackedKernels {
  int max_mt;
  void (*quantize)(const float* x, int64_t k, int8_t* q, float* d, float* s);
  void (*tile)(int qtype, const uint8_t* g, const PackedX& x, int64_t x0, int mt, float* out);
};

GgufPackedKernels gguf_packed_kernels_scalar();
#ifdef ENGINE_X86
GgufPackedKernels gguf_packed_kernels_avx2();
GgufPackedKernels gguf_packed_kernels_avx512();
#endif

// The fp32-activation linear on the same packed copy: gguf_linear(a) (x never quantized; per block and row
// d * sum(q_j x_j) + m * sum(x_j) in fp32, gguf_packed_f32_impl.h) with the weight read from `packed`. Where
// gguf_packed_f32_variant() is "" (NEON, VSX, RVV, or the ISA changed since packing), gguf_linear(a) on the raw
// rows. Same validation as gguf_linear.
void gguf_linear_packed(const GgufLinearArgs& a, const uint8_t* packed);
// avx512 (AVX-512F is enough), avx2 or scalar; "" exactly where gguf_packed_variant() is "".
const char* gguf_packed_f32_variant();

// fp32 x as the packed fp32 tile reads it, cut into tiles of mt rows (the driver's tiles: rows x0 .. x0 + mt - 1,
// x0 a multiple of max_mt): a tile is [k][mt] at x + x0 * k (element c of row x0 + i at c * mt + i), its block
// sums of x [k / 32][mt] at xsum + x0 * (k / 32).
struct PackedF32X {
  const float* x;
  const float* xsum;
  int64_t k;
  bool scaled;  // a Q4 tile's x is scaled as GgufPackedF32Kernels says (from scaled_from rows of x)
};

// Per-ISA fp32 tile: out[i * 16 + r] = row x0 + i of x (i < mt <= max_mt <= kPackedF32MaxTileRows) . row r of
// the group at g. From
// scaled_from rows of x (none: 2^62), a Q4 tile reads element e of x times 2^(-4t), t = its nibble's position in
// the packed int32 lane (e < 16: 2 (e % 4), else 2 (e % 4) + 1; none for t = 7), and decodes each nibble in place;
// the block sums stay those of x. Above max_m rows of x (and below dense_from) the driver runs gguf_linear on the
// raw rows (measured per ISA).
constexpr int kPackedF32MaxTileRows = 16;
struct GgufPackedF32Kernels {
  int max_mt;
  int64_t scaled_from;
  int64_t max_m;
  void (*tile)(int qtype, const uint8_t* g, const PackedF32X& x, int64_t x0, int mt, float* out);
  // The decode-once path, from dense_from rows of x (where it is measured faster; none: 2^62): decode_group
  // writes the group's weights as fp32 (w = q d + m) to buf [k][16]; dense_tile: out[i * 16 + r] = row i of the
  // x tile ([k][mt] at xt, unscaled, mt <= dense_mt) . buf's row r.
  int64_t dense_from;
  int dense_mt;
  void (*decode_group)(int qtype, const uint8_t* g, int64_t nb, float* buf);
  void (*dense_tile)(const float* buf, int64_t k, const float* xt, int mt, float* out);
};

GgufPackedF32Kernels gguf_packed_f32_kernels_scalar();
#ifdef ENGINE_X86
GgufPackedF32Kernels gguf_packed_f32_kernels_avx2();
GgufPackedF32Kernels gguf_packed_f32_kernels_avx512();
#endif

}  // namespace engine_cpu
