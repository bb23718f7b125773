// Paged attention: argument validation, the split into tiles, scheduling, and the merge of key
// partitions. The per-tile math is paged_attention_impl.h, instantiated per ISA by
// paged_attention_{scalar,avx2,avx512,neon,vsx,rvv}.cpp.
#include "paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "thread_pool.h"

namespace engine_cpu {
namespace {

using TileFn = void (*)(const AttnTile&);

// (query row, key) pairs per extra worker: ~5 us of work with the cache in DRAM, where a decode step finds it (the
// step's weights have streamed through the L3 since the layer's last read). 1024, sized on hot caches, kept one
// sequence on one thread up to ~110 keys: 2-5 us a layer slower there (2-core Zen 5, 2026-12-02).
constexpr int64_t kMinKeyRowsPerThread = 256;

TileFn tile_fn() {
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return attn_tile_avx512;
    case Isa::Avx2: return attn_tile_avx2;
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return attn_tile_neon;
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return attn_tile_vsx;
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: return attn_tile_rvv;
#endif
    default: return attn_tile_scalar;
  }
}

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("paged_attention: " + what); }

int64_t bt_at(const PagedAttnArgs& a, int64_t b, int64_t j) {
  return a.block_tables[b * a.bt_stride0 + j * a.bt_stride1];
}

// Shapes, then every seq_len, cu_seqlens_q entry and block-table entry the tiles will follow.
void validate(const PagedAttnArgs& a) {
  if (a.dtype != DType::F32 && a.dtype != DType::BF16 && a.dtype != DType::F16)
    bad("dtype must be fp32, bf16 or fp16");
  if (a.hk <= 0 || a.hq <= 0 || a.hq % a.hk) bad("Hq must be a positive multiple of Hk");
  if ((a.head_dim < 16 || a.head_dim > kAttnMaxHeadDim || a.head_dim % 16) && a.head_dim != kAttnLatentDim)
    bad("head_dim must be a multiple of 16 in [16, 256] or 576, got " + std::to_string(a.head_dim));
  if (a.block_size <= 0 || a.num_blocks != a.v_num_blocks)
    bad("key and value caches must have the same number of blocks, and block_size > 0");
  if (a.bt_rows != a.num_seqs) bad("block_tables has " + std::to_string(a.bt_rows) + " rows for " +
                                   std::to_string(a.num_seqs) + " sequences");
  const int64_t max_len = a.max_blocks * a.block_size;
  if (a.cu_seqlens_q == nullptr) {
    if (a.num_tokens != a.num_seqs) bad("decode takes one query per sequence: " + std::to_string(a.num_tokens) +
                                        " queries, " + std::to_string(a.num_seqs) + " sequences");
  } else {
    if (a.cu_len != a.num_seqs + 1) bad("cu_seqlens_q must have num_seqs + 1 entries");
    if (a.cu_seqlens_q[0] != 0 || a.cu_seqlens_q[a.num_seqs] != a.num_tokens)
      bad("cu_seqlens_q must run from 0 to the number of query rows");
  }
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t len = a.seq_lens[b];
    const int64_t q_len = a.cu_seqlens_q ? int64_t(a.cu_seqlens_q[b + 1]) - a.cu_seqlens_q[b] : 1;
    if (q_len < 0) bad("cu_seqlens_q must not decrease");
    if (q_len == 0) continue;
    if (len < q_len || len > max_len)
      bad("sequence " + std::to_string(b) + " has seq_len " + std::to_string(len) + " and " +
          std::to_string(q_len) + " queries; need q_len <= seq_len <= max_blocks * block_size = " +
          std::to_string(max_len));
    for (int64_t j = 0, n = (len + a.block_size - 1) / a.block_size; j < n; ++j) {
      const int64_t blk = bt_at(a, b, j);
      if (blk < 0 || blk >= a.num_blocks)
        bad("block_tables[" + std::to_string(b) + ", " + std::to_string(j) + "] = " + std::to_string(blk) +
            " is outside the cache's " + std::to_string(a.num_blocks) + " blocks");
    }
  }
}

struct Item {
  int64_t b, kvh, q_row, nq, pos0, k_begin, k_end, state;  // state < 0: write the output directly
  int64_t cost;
};

// Decode with few (sequence, KV head) pairs leaves threads idle: split each context into key
// partitions (flash-decoding) so there are about 8 items per thread, merged afterwards.
int64_t decode_partition(const PagedAttnArgs& a, int threads) {
  const int64_t pairs = a.num_seqs * a.hk;
  if (threads <= 1 || pairs == 0 || pairs >= 4 * threads) return std::numeric_limits<int64_t>::max();
  int64_t max_len = 1;
  for (int64_t b = 0; b < a.num_seqs; ++b) max_len = std::max<int64_t>(max_len, a.seq_lens[b]);
  const int64_t splits = (8 * threads + pairs - 1) / pairs;
  const int64_t part = (max_len + splits - 1) / splits;
  return std::max<int64_t>(128, (part + 63) / 64 * 64);
}

// Combines the key partitions [s0, s0 + parts) of one (sequence, KV head): rows g of the G heads.
void merge(const PagedAttnArgs& a, const float* m, const float* l, const float* acc, int64_t s0, int64_t parts,
           int64_t q_row, int64_t kvh) {
  const int64_t G = a.hq / a.hk, D = a.head_dim;
  std::vector<float> o(D);
  for (int64_t g = 0; g < G; ++g) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < parts; ++p) mx = std::max(mx, m[(s0 + p) * G + g]);
    float sum = 0;
    std::fill(o.begin(), o.end(), 0.0f);
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t r = (s0 + p) * G + g;
      const float w = std::exp(m[r] - mx);
      sum += w * l[r];
      for (int64_t d = 0; d < D; ++d) o[d] += w * acc[r * D + d];
    }
    const int64_t dst = (q_row * a.hq + kvh * G + g) * D;
    for (int64_t d = 0; d < D; ++d) {
      const float v = o[d] / sum;
      if (a.dtype == DType::BF16) static_cast<uint16_t*>(a.out)[dst + d] = f32_to_bf16(v);
      else if (a.dtype == DType::F16) static_cast<uint16_t*>(a.out)[dst + d] = f32_to_fp16(v);
      else static_cast<float*>(a.out)[dst + d] = v;
    }
  }
}

}  // namespace

void paged_attention(const PagedAttnArgs& a) {
  validate(a);
  const int threads = num_threads();
  const int64_t G = a.hq / a.hk, D = a.head_dim;
  const bool decode = a.cu_seqlens_q == nullptr;
  // Prefill tiles hold ~48 query rows: each key chunk, converted once, serves them all from L1.
  const int64_t tq = decode ? 1 : std::max<int64_t>(1, 48 / G);
  const int64_t part = decode ? decode_partition(a, threads) : std::numeric_limits<int64_t>::max();
  const bool split = part != std::numeric_limits<int64_t>::max();

  std::vector<Item> items;
  struct Group { int64_t s0, parts, q_row, kvh; };
  std::vector<Group> groups;
  int64_t states = 0;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t len = a.seq_lens[b];
    const int64_t q0 = decode ? b : a.cu_seqlens_q[b];
    const int64_t q_len = decode ? 1 : a.cu_seqlens_q[b + 1] - q0;
    for (int64_t kvh = 0; kvh < a.hk; ++kvh) {
      if (split) {
        const int64_t parts = (len + part - 1) / part;
        groups.push_back({states, parts, q0, kvh});
        for (int64_t p = 0; p < parts; ++p) {
          const int64_t kb = p * part, ke = std::min(len, kb + part);
          items.push_back({b, kvh, q0, 1, len - 1, kb, ke, states++, ke - kb});
        }
        continue;
      }
      for (int64_t i = 0; i < q_len; i += tq) {
        const int64_t nq = std::min(tq, q_len - i), pos0 = len - q_len + i;
        items.push_back({b, kvh, q0 + i, nq, pos0, 0, pos0 + nq, -1, nq * (pos0 + nq)});
      }
    }
  }
  // Most expensive first, handed out dynamically: causal tiles and mixed lengths differ in cost. Ties by sequence,
  // then KV head.
  std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    return x.cost != y.cost ? x.cost > y.cost : x.b != y.b ? x.b < y.b : x.kvh < y.kvh;
  });
  std::vector<float> state(split ? states * G * (D + 2) : 0);
  float* sm = state.data();
  float* sl = sm + states * G;
  float* sacc = sl + states * G;

  const TileFn fn = tile_fn();
  const int64_t es = a.dtype == DType::F32 ? 4 : 2;
  const int64_t n_items = static_cast<int64_t>(items.size());
  std::atomic<int64_t> next{0};
  // Unsplit decode: a thread takes all KV heads of a sequence in a row (the order above puts them together). Its
  // cache rows hold every head's K (or V) of a token side by side, so the heads after the first find much of their
  // rows already on their way by the hardware prefetchers: 32 sequences x 30 layers of DRAM-resident caches ran
  // ~11% faster than with the heads handed out one by one (2-core Zen 5, 2026-12-01).
  const int64_t take = decode && !split ? a.hk : 1;
  auto tile_of = [&](const Item& it) {
    AttnTile t;
    const int64_t qoff = (it.q_row * a.hq + it.kvh * G) * D * es;
    t.q = static_cast<const char*>(a.q) + qoff;
    t.q_stride = a.hq * D;
    t.nq = static_cast<int>(it.nq);
    t.G = static_cast<int>(G);
    t.head_dim = static_cast<int>(D);
    t.k_cache = a.k_cache;
    t.v_cache = a.v_cache;
    t.blocks = a.block_tables + it.b * a.bt_stride0;
    t.blocks_stride = a.bt_stride1;
    t.block_size = a.block_size;
    t.tok_stride = a.hk * D;
    t.blk_stride = a.block_size * a.hk * D;
    t.head_off = it.kvh * D;
    t.k_begin = it.k_begin;
    t.k_end = it.k_end;
    t.pos0 = it.pos0;
    t.scale = a.scale;
    t.dtype = a.dtype;
    t.out = it.state < 0 ? static_cast<char*>(a.out) + qoff : nullptr;
    t.out_stride = a.hq * D;
    t.m = it.state < 0 ? nullptr : sm + it.state * G;
    t.l = it.state < 0 ? nullptr : sl + it.state * G;
    t.acc = it.state < 0 ? nullptr : sacc + it.state * G * D;
    return t;
  };
  auto work = [&](int64_t, int64_t) {
    for (int64_t k0; (k0 = next.fetch_add(take, std::memory_order_relaxed)) < n_items;) {
      const int64_t k1 = std::min(n_items, k0 + take);
      for (int64_t k = k0; k < k1; ++k) {
        AttnTile t = tile_of(items[k]);
        if (k + 1 < k1) {  // the next tile of this thread's run: its first keys load during this tile's last chunk
          const AttnTile following = tile_of(items[k + 1]);
          t.after = attn_rows(following, following.k_begin, following.block_size, es);
        }
        fn(t);
      }
    }
  };
  // Waking the pool costs microseconds: small problems (short decode contexts) stay on this thread.
  int64_t key_rows = 0;
  for (const Item& it : items) key_rows += it.cost * G;
  const int64_t workers = std::min<int64_t>({threads, n_items, 1 + key_rows / kMinKeyRowsPerThread});
  parallel_for(workers, 1, work);
  for (const Group& g : groups) merge(a, sm, sl, sacc, g.s0, g.parts, g.q_row, g.kvh);
}

}  // namespace engine_cpu
