// Paged attention over the KV cache, fp32 math with an online softmax, fp32 or bf16 storage.
// Layouts follow engine.core.ops.attention: q/out [T, Hq, D]; caches [num_blocks, block_size, Hk, D];
// block_tables int32 [B, max_blocks]; seq_lens int32 [B]. Decode: query b is row b and sits at
// position seq_lens[b] - 1. Prefill: sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1], the
// last q_len positions of its seq_lens[b] tokens, each attending causally.
// The kernels never read a cache slot at or past seq_lens[b]: fresh caches hold arbitrary bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "convert.h"
#include "isa.h"

namespace engine_cpu {

constexpr int64_t kAttnMaxHeadDim = 256;  // head_dim must be a multiple of 16 in [16, 256], or kAttnLatentDim
// DeepSeek-V2/V3's latent rows (kv_lora_rank 512 + rope 64): MLA's absorbed attention is this attention with one KV
// head of 576 channels, the values being the first 512 (engine/platforms/cpu/kernels/mla.py).
constexpr int64_t kAttnLatentDim = 576;

struct PagedAttnArgs {
  const void* q;  // [T, Hq, D], contiguous
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  int64_t bt_rows, max_blocks, bt_stride0, bt_stride1;  // strides in elements
  const int32_t* seq_lens;
  int64_t num_seqs;
  const int32_t* cu_seqlens_q;  // nullptr: decode
  int64_t cu_len;               // prefill: elements of cu_seqlens_q (must be num_seqs + 1)
  void* out;                    // [T, Hq, D], contiguous
  int64_t num_tokens, hq, hk, head_dim;
  int64_t num_blocks, v_num_blocks, block_size;
  float scale;
  DType dtype;
};

// Validates every index it will follow (throws std::invalid_argument) before any thread starts.
void paged_attention(const PagedAttnArgs& a);

// The K and V rows of the keys from position c on: up to `chunk` of them, within c's cache block (blocks are
// scattered, so the hardware prefetchers lose the stream at every block boundary and the tile prefetches them).
struct AttnRows {
  const char* k = nullptr;
  const char* v = nullptr;
  int n = 0;
};

// One unit of work: nq consecutive queries of one sequence, the G query heads of one KV head, over
// key positions [k_begin, k_end). Query i sits at position pos0 + i and sees keys < pos0 + i + 1.
// Rows are r = i * G + g. With out != nullptr the rows are normalised and written there in dtype;
// otherwise the unnormalised state (running max m, sum l, acc = sum exp(s - m) v) goes to m/l/acc,
// for a later merge of key partitions.
struct AttnTile {
  const void* q;     // query 0, head g = 0 of this KV head's group
  int64_t q_stride;  // elements between consecutive queries (Hq * D); heads are D apart
  int nq, G, head_dim;
  const void* k_cache;
  const void* v_cache;
  const int32_t* blocks;  // this sequence's block-table row
  int64_t blocks_stride;
  int64_t block_size, tok_stride, blk_stride, head_off;  // cache strides in elements
  int64_t k_begin, k_end, pos0;
  float scale;
  DType dtype;
  void* out;
  int64_t out_stride;
  float* m;
  float* l;
  float* acc;  // [nq * G, head_dim]
  AttnRows after;  // the first keys of the tile this thread runs next, prefetched during this one's last chunk
};

// Where those rows lie for tile t.
inline AttnRows attn_rows(const AttnTile& t, int64_t c, int64_t chunk, int64_t elem_size) {
  if (c >= t.k_end) return {};
  const int64_t blk = c / t.block_size, off = c - blk * t.block_size;
  const int64_t n = std::min<int64_t>(std::min<int64_t>(chunk, t.k_end - c), t.block_size - off);
  const int64_t base = (int64_t(t.blocks[blk * t.blocks_stride]) * t.blk_stride + off * t.tok_stride + t.head_off) *
                       elem_size;
  return {static_cast<const char*>(t.k_cache) + base, static_cast<const char*>(t.v_cache) + base,
          static_cast<int>(n)};
}

// Prefetches the bytes [p, p + n).
inline void attn_prefetch(const char* p, int64_t n) {
  for (int64_t b = 0; b < n; b += 64) __builtin_prefetch(p + b);
}

void attn_tile_scalar(const AttnTile& t);
#ifdef ENGINE_X86
void attn_tile_avx2(const AttnTile& t);
void attn_tile_avx512(const AttnTile& t);
#endif
#ifdef ENGINE_ARM64
void attn_tile_neon(const AttnTile& t);
#endif
#ifdef ENGINE_VSX
void attn_tile_vsx(const AttnTile& t);
#endif
#ifdef ENGINE_RVV
void attn_tile_rvv(const AttnTile& t);
#endif

struct KvWriteArgs {
  const void* key;
  const void* value;
  void* k_cache;
  void* v_cache;
  const int64_t* slots;  // [T]; < 0: skip the token
  int64_t tokens, value_tokens, slot_tokens;
  int64_t row_bytes;  // Hk * D * element size: one token's contiguous row
  int64_t num_slots, v_num_slots;  // num_blocks * block_size of each cache
};

// Scatters token rows into the caches; validates every slot before writing anything.
void write_kv_cache(const KvWriteArgs& a);

}  // namespace engine_cpu
