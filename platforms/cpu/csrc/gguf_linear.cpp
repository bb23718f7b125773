// Driver: validation, threading over weight panels, bf16 widening and output rounding. The kernels are
// gguf_linear_impl.h instantiated per ISA (gguf_linear_{scalar,avx2,avx512,neon,vsx}.cpp) and RVV's own.
#include "gguf_linear.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_dequant.h"
#include "thread_pool.h"

namespace engine_cpu {

const float* fp16_lut() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = fp16_to_f32(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

GgufLinearKernels gguf_linear_kernels(Isa isa) {
  switch (isa) {
#ifdef ENGINE_X86
    case Isa::Avx512: return gguf_linear_kernels_avx512();
    case Isa::Avx2: return gguf_linear_kernels_avx2();
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return gguf_linear_kernels_neon();
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return gguf_linear_kernels_vsx();
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: return gguf_linear_kernels_rvv();
#endif
    default: return gguf_linear_kernels_scalar();
  }
}

namespace {

// n floats of buf, 64-byte aligned (buf grows as needed).
float* aligned_floats(std::vector<float>& buf, int64_t n) {
  if (buf.size() < static_cast<size_t>(n + 16)) buf.resize(static_cast<size_t>(n + 16));
  return buf.data() + (16 - reinterpret_cast<uintptr_t>(buf.data()) / 4 % 16) % 16;
}

// Work below which a chunk is not worth handing to another thread, in rough "decoded weight
// elements" (a decoded element costs about as much as 8 FMAs over rows of x).
constexpr int64_t kMinChunkWork = 1 << 15;
// Rows of x per pass over the weight (a multiple of kMaxTileM, so a chunk's tiles are the unchunked ones).
constexpr int64_t kRowChunk = 21 * kMaxTileM;

}  // namespace

void check_gguf_linear_args(const GgufLinearArgs& a, const char* op, bool kquants) {
  const std::string name(op);
  const bool k_type = gguf_kquant_bytes(a.qtype) != 0;
  if (gguf_block_bytes(a.qtype) == 0 && !(kquants && k_type))
    throw std::invalid_argument(name + ": unsupported qtype " + std::to_string(a.qtype) + "; supported: Q4_0=2, Q4_1=3, "
                                "Q8_0=8" + (kquants ? ", Q4_K=12, Q5_K=13, Q6_K=14" : ""));
  if (gguf_row_bytes(a.qtype, a.k) == 0 || a.m < 0 || a.n < 0)
    throw std::invalid_argument(name + ": k must be a positive multiple of " + (k_type ? "256" : "32") +
                                ", m and n >= 0");
  if (a.w_stride < gguf_row_bytes(a.qtype, a.k) || a.x_stride < a.k || a.y_stride < a.n)
    throw std::invalid_argument(name + ": a row stride is smaller than its row");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16)
    throw std::invalid_argument(name + ": dtype must be fp32 or bf16");
}

namespace {

// The K-quant decode of `kern`, or the scalar build's where the ISA has none (RVV).
using DecodeK = void (*)(int, const uint8_t*, int64_t, int, int64_t, float*);
DecodeK decode_k_of(const GgufLinearKernels& kern) {
  return kern.decode_k != nullptr ? kern.decode_k : gguf_linear_kernels_scalar().decode_k;
}

}  // namespace

void gguf_kquant_dequant(const DequantArgs& a) {
  const DecodeK decode = decode_k_of(gguf_linear_kernels(current_isa()));
  if (a.rows <= 0) return;
  const int64_t grain = std::max<int64_t>(1, kMinChunkWork / a.cols);
  for_dynamic_chunks(a.rows, grain, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> buf;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = a.src + r * a.src_stride;
      if (a.dtype == DType::F32) {
        decode(a.qtype, src, a.src_stride, 1, a.cols, static_cast<float*>(a.dst) + r * a.dst_stride);
        continue;
      }
      float* const row = aligned_floats(buf, a.cols);
      decode(a.qtype, src, a.src_stride, 1, a.cols, row);
      uint16_t* dst = static_cast<uint16_t*>(a.dst) + r * a.dst_stride;
      for (int64_t c = 0; c < a.cols; ++c) dst[c] = f32_to_bf16(row[c]);
    }
  });
}

void gguf_linear(const GgufLinearArgs& a) {
  check_gguf_linear_args(a, "gguf_linear", true);
  if (a.m == 0 || a.n == 0) return;

  const GgufLinearKernels kern = gguf_linear_kernels(current_isa());
  const bool k_type = gguf_kquant_bytes(a.qtype) != 0;
  const DecodeK decode_k = k_type ? decode_k_of(kern) : nullptr;
  const float* lut = fp16_lut();
  const int64_t k = a.k, m = a.m, n = a.n;

  // x as fp32 rows: bf16 widens exactly, so the math is the same for both dtypes.
  const float* x = static_cast<const float*>(a.x);
  int64_t xs = a.x_stride;
  thread_local std::vector<float> xbuf;
  if (a.dtype == DType::BF16) {
    float* const xf = aligned_floats(xbuf, m * k);
    for (int64_t i = 0; i < m; ++i) {
      const uint16_t* src = static_cast<const uint16_t*>(a.x) + i * a.x_stride;
      float* dst = xf + i * k;
      for (int64_t c = 0; c < k; ++c) dst[c] = bf16_to_f32(src[c]);
    }
    x = xf;
    xs = k;
  }

  const int64_t tiles = (n + kPanelRows - 1) / kPanelRows;
  if (m == 1 && k_type) {  // K-quants: each row's super-blocks dotted with x as they are decoded
    const auto gemv_k = kern.gemv_k != nullptr ? kern.gemv_k : gguf_linear_kernels_scalar().gemv_k;
    thread_local std::vector<float> xsum_buf;
    xsum_buf.resize(static_cast<size_t>(k / 32));
    for (int64_t j = 0; j < k / 32; ++j) {
      float s = 0.0f;
      for (int i = 0; i < 32; ++i) s += x[32 * j + i];
      xsum_buf[static_cast<size_t>(j)] = s;
    }
    const float* xsum = xsum_buf.data();
    const int64_t grain = std::max<int64_t>(1, kMinChunkWork / (k * kPanelRows));
    for_dynamic_chunks(tiles, grain, [&](int64_t t0, int64_t t1) {
      constexpr int64_t kRows = 64;
      float tmp[kRows];
      for (int64_t n0 = t0 * kPanelRows, n1 = std::min(n, t1 * kPanelRows); n0 < n1; n0 += kRows) {
        const int rows = static_cast<int>(std::min(kRows, n1 - n0));
        gemv_k(a.qtype, a.w + n0 * a.w_stride, a.w_stride, rows, k, x, xsum, tmp);
        if (a.dtype == DType::F32) std::memcpy(static_cast<float*>(a.y) + n0, tmp, sizeof(float) * rows);
        else for (int j = 0; j < rows; ++j) static_cast<uint16_t*>(a.y)[n0 + j] = f32_to_bf16(tmp[j]);
      }
    });
    return;
  }
  if (m == 1 && kern.gemv != nullptr && !k_type) {
    const int64_t grain = std::max<int64_t>(1, kMinChunkWork / (k * kPanelRows));
    for_dynamic_chunks(tiles, grain, [&](int64_t t0, int64_t t1) {
      constexpr int64_t kRows = 64;  // rows per call: enough to amortize, small enough for the stack
      float tmp[kRows];
      for (int64_t n0 = t0 * kPanelRows, n1 = std::min(n, t1 * kPanelRows); n0 < n1; n0 += kRows) {
        const int rows = static_cast<int>(std::min(kRows, n1 - n0));
        kern.gemv(a.qtype, a.w + n0 * a.w_stride, a.w_stride, rows, k, x, tmp, lut);
        if (a.dtype == DType::F32) std::memcpy(static_cast<float*>(a.y) + n0, tmp, sizeof(float) * rows);
        else for (int j = 0; j < rows; ++j) static_cast<uint16_t*>(a.y)[n0 + j] = f32_to_bf16(tmp[j]);
      }
    });
    return;
  }
  // Prefill-sized M goes kRowChunk rows at a time: every panel re-reads its rows of x, which then stay in L2
  // (a chunk of 1536-column rows is ~770 KB). All rows at once, x spills to L3 from M ~ 512: on the 2-core
  // Zen 5 the SmolLM2 layers ran at 288-347 GFLOP/s at M = 512-2048 instead of ~400 in chunks (measured
  // 2026-12-01). Re-decoding the panels per chunk costs about 1/kRowChunk of the FMAs.
  for (int64_t mc = 0; mc < m; mc += kRowChunk) {
    const int64_t mn = std::min(kRowChunk, m - mc);
    const int64_t tile_work = k * kPanelRows * (1 + mn / 8);
    const int64_t grain = std::max<int64_t>(1, kMinChunkWork / tile_work);
    for_dynamic_chunks(tiles, grain, [&](int64_t t0, int64_t t1) {
      // 64-byte aligned (k is a multiple of 32, so every panel row is too): a vector load that straddles two
      // cache lines costs two, and malloc's 16-byte alignment made that the case for every AVX-512 load and
      // half the AVX2 ones, depending on the heap (0.8x swings in M = 16 time between runs, measured).
      thread_local std::vector<float> panel_buf;
      float* const panel = aligned_floats(panel_buf, kPanelRows * k);
      float tile[kMaxTileM * kPanelRows];
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * kPanelRows;
        const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, n - n0));
        if (k_type) decode_k(a.qtype, a.w + n0 * a.w_stride, a.w_stride, rows, k, panel);
        else kern.decode(a.qtype, a.w + n0 * a.w_stride, a.w_stride, rows, k, panel, lut);
        if (rows < kPanelRows) std::memset(panel + rows * k, 0, sizeof(float) * (kPanelRows - rows) * k);
        for (int64_t m0 = mc; m0 < mc + mn; m0 += kMaxTileM) {
          const int mt = static_cast<int>(std::min<int64_t>(kMaxTileM, mc + mn - m0));
          kern.dot(x + m0 * xs, xs, mt, panel, k, tile);
          for (int i = 0; i < mt; ++i) {
            const float* src = tile + i * kPanelRows;
            if (a.dtype == DType::F32) {
              float* dst = static_cast<float*>(a.y) + (m0 + i) * a.y_stride + n0;
              for (int j = 0; j < rows; ++j) dst[j] = src[j];
            } else {
              uint16_t* dst = static_cast<uint16_t*>(a.y) + (m0 + i) * a.y_stride + n0;
              for (int j = 0; j < rows; ++j) dst[j] = f32_to_bf16(src[j]);
            }
          }
        }
      }
    });
  }
}

}  // namespace engine_cpu
