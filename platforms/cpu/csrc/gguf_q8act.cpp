// Driver of the Q8-activation GGUF linear (validation, quantizing x, threading over weight panels,
// output rounding); the quantizers and tiles are gguf_q8act_impl.h per ISA (and RVV's tile).
#include "gguf_q8act.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_dequant.h"
#include "gguf_linear.h"
#include "thread_pool.h"

namespace engine_cpu {

namespace {

// Below this much work (weight bytes x rows of x, roughly) a chunk stays on one thread.
constexpr int64_t kMinChunkWork = 1 << 14;

}  // namespace

GgufQ8Kernels gguf_q8_kernels() {
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return cpu_has_avx512_vnni() ? gguf_q8_kernels_avx512() : gguf_q8_kernels_avx2();
    case Isa::Avx2: return gguf_q8_kernels_avx2();
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return gguf_q8_kernels_neon();
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return gguf_q8_kernels_vsx();
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: return gguf_q8_kernels_rvv();
#endif
    default: return gguf_q8_kernels_scalar();
  }
}

const char* gguf_q8act_variant() {
  switch (current_isa()) {
    case Isa::Avx512: return cpu_has_avx512_vnni() ? "avx512_vnni" : "avx2";
    case Isa::Avx2: return "avx2";
    case Isa::Neon: return cpu_has_dotprod() ? "neon_dotprod" : "neon";
    case Isa::Vsx: return "vsx";
#ifdef ENGINE_RVV
    case Isa::Rvv: return "rvv";
#endif
    default: return "scalar";
  }
}

void gguf_linear_q8act(const GgufLinearArgs& a) {
  check_gguf_linear_args(a, "gguf_linear_q8act");
  if (a.m == 0 || a.n == 0) return;
  const int bb = gguf_block_bytes(a.qtype);

  const GgufQ8Kernels kern = gguf_q8_kernels();
  const float* lut = fp16_lut();
  const int64_t k = a.k, m = a.m, n = a.n, nb = k / 32;

  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> dbuf, sbuf;
  // Worker threads see their own thread_local buffers: hand them this thread's by address. 64-byte aligned:
  // the tiles load whole vectors of them, and a load across two cache lines costs two (malloc aligns to 16,
  // which made the AVX-512 tile's speed depend on where the heap put the buffers: up to 10%, measured).
  int8_t* qp = aligned64(qbuf, static_cast<size_t>(m * k));
  float* dp = aligned64(dbuf, static_cast<size_t>(m * nb * kern.lanes));
  float* sp = aligned64(sbuf, static_cast<size_t>(m * nb * kern.lanes));
  parallel_for(m, std::max<int64_t>(1, 8192 / k), [&](int64_t r0, int64_t r1) {
    std::vector<float> row;
    for (int64_t i = r0; i < r1; ++i) {
      const float* xr = x_row_f32(a, i, row);
      const int64_t ds = i * nb * kern.lanes;
      kern.quantize(xr, k, qp + i * k, dp + ds, sp + ds);
    }
  });
  const Q8Rows xq{qp, dp, sp, k, kern.lanes};

  const int64_t tiles = (n + kQ8PanelRows - 1) / kQ8PanelRows;
  const int64_t tile_work = nb * bb * kQ8PanelRows * std::max<int64_t>(1, m / 2);
  for_dynamic_chunks(tiles, std::max<int64_t>(1, kMinChunkWork / tile_work), [&](int64_t t0, int64_t t1) {
    float tile[64 * kQ8PanelRows];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kQ8PanelRows;
      const int rows = static_cast<int>(std::min<int64_t>(kQ8PanelRows, n - n0));
      for (int64_t m0 = 0; m0 < m; m0 += kern.max_mt) {
        const int mt = static_cast<int>(std::min<int64_t>(kern.max_mt, m - m0));
        kern.tile(a.qtype, a.w + n0 * a.w_stride, a.w_stride, rows, xq, m0, mt, tile, lut);
        store_y_tile(a, tile, kQ8PanelRows, m0, mt, n0, rows);
      }
    }
  });
}

}  // namespace engine_cpu
