// Driver (validation, threading over weight panels, bf16 widening and output rounding) and the
// portable scalar kernels.
#include "gguf_linear.h"

#include <algorithm>
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

namespace {

// ---- scalar kernels ----------------------------------------------------------------------------
// Values as the reference computes them: (q - 8) * d, q * d + m (multiply, then add), q * d.
void decode_scalar(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst,
                   const float* lut) {
  const int bb = gguf_block_bytes(qtype);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* b = w + r * w_stride;
    float* out = dst + r * k;
    for (int64_t c = 0; c < k; c += 32, b += bb, out += 32) {
      const float d = lut[load_fp16(b)];
      if (qtype == kQ8_0) {
        for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      } else if (qtype == kQ4_0) {
        for (int j = 0; j < 16; ++j) {
          out[j] = static_cast<float>((b[2 + j] & 0x0f) - 8) * d;
          out[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
        }
      } else {
        const float m = lut[load_fp16(b + 2)];
        for (int j = 0; j < 16; ++j) {
          out[j] = static_cast<float>(b[4 + j] & 0x0f) * d + m;
          out[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
        }
      }
    }
  }
}

void dot_scalar(const float* x, int64_t x_stride, int mt, const float* panel, int64_t k, float* out) {
  for (int i = 0; i < mt; ++i) {
    const float* xi = x + i * x_stride;
    for (int j = 0; j < kPanelRows; ++j) {
      const float* wj = panel + j * k;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // partial sums: shorter dependency chains, smaller error
      for (int64_t c = 0; c < k; c += 8)
        for (int l = 0; l < 8; ++l) acc[l] += xi[c + l] * wj[c + l];
      out[i * kPanelRows + j] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
}

GgufLinearKernels kernels_for(Isa isa) {
  switch (isa) {
#ifdef ENGINE_X86
    case Isa::Avx512: return gguf_linear_kernels_avx512();
    case Isa::Avx2: return gguf_linear_kernels_avx2();
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: return gguf_linear_kernels_rvv();
#endif
    default: return gguf_linear_kernels_scalar();
  }
}

// Work below which a chunk is not worth handing to another thread, in rough "decoded weight
// elements" (a decoded element costs about as much as 8 FMAs over rows of x).
constexpr int64_t kMinChunkWork = 1 << 15;

}  // namespace

GgufLinearKernels gguf_linear_kernels_scalar() { return {decode_scalar, dot_scalar, nullptr}; }

void check_gguf_linear_args(const GgufLinearArgs& a, const char* op) {
  const std::string name(op);
  if (gguf_block_bytes(a.qtype) == 0)
    throw std::invalid_argument(name + ": unsupported qtype " + std::to_string(a.qtype) +
                                "; supported: Q4_0=2, Q4_1=3, Q8_0=8");
  if (a.k <= 0 || a.k % 32 != 0 || a.m < 0 || a.n < 0)
    throw std::invalid_argument(name + ": k must be a positive multiple of 32, m and n >= 0");
  if (a.w_stride < a.k / 32 * gguf_block_bytes(a.qtype) || a.x_stride < a.k || a.y_stride < a.n)
    throw std::invalid_argument(name + ": a row stride is smaller than its row");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16)
    throw std::invalid_argument(name + ": dtype must be fp32 or bf16");
}

void gguf_linear(const GgufLinearArgs& a) {
  check_gguf_linear_args(a, "gguf_linear");
  if (a.m == 0 || a.n == 0) return;

  const GgufLinearKernels kern = kernels_for(current_isa());
  const float* lut = fp16_lut();
  const int64_t k = a.k, m = a.m, n = a.n;

  // x as fp32 rows: bf16 widens exactly, so the math is the same for both dtypes.
  const float* x = static_cast<const float*>(a.x);
  int64_t xs = a.x_stride;
  thread_local std::vector<float> xbuf;
  if (a.dtype == DType::BF16) {
    xbuf.resize(static_cast<size_t>(m * k));
    for (int64_t i = 0; i < m; ++i) {
      const uint16_t* src = static_cast<const uint16_t*>(a.x) + i * a.x_stride;
      float* dst = xbuf.data() + i * k;
      for (int64_t c = 0; c < k; ++c) dst[c] = bf16_to_f32(src[c]);
    }
    x = xbuf.data();
    xs = k;
  }

  const int64_t tiles = (n + kPanelRows - 1) / kPanelRows;
  if (m == 1 && kern.gemv != nullptr) {
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
  const int64_t tile_work = k * kPanelRows * (1 + m / 8);
  const int64_t grain = std::max<int64_t>(1, kMinChunkWork / tile_work);
  for_dynamic_chunks(tiles, grain, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> panel;
    if (panel.size() < static_cast<size_t>(kPanelRows * k)) panel.resize(static_cast<size_t>(kPanelRows * k));
    float tile[kMaxTileM * kPanelRows];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kPanelRows;
      const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, n - n0));
      kern.decode(a.qtype, a.w + n0 * a.w_stride, a.w_stride, rows, k, panel.data(), lut);
      if (rows < kPanelRows) std::memset(panel.data() + rows * k, 0, sizeof(float) * (kPanelRows - rows) * k);
      for (int64_t m0 = 0; m0 < m; m0 += kMaxTileM) {
        const int mt = static_cast<int>(std::min<int64_t>(kMaxTileM, m - m0));
        kern.dot(x + m0 * xs, xs, mt, panel.data(), k, tile);
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

}  // namespace engine_cpu
