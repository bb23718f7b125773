// Dispatcher and the portable scalar path.
#include "gguf_dequant.h"

#include <stdexcept>
#include <string>

#include "isa.h"

namespace engine_cpu {

int gguf_block_bytes(int qtype) {
  switch (qtype) {
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ8_0: return 34;
    default: return 0;
  }
}

namespace {

void dequant_block(int qtype, const uint8_t* b, float* out) {
  const float d = fp16_to_f32(load_fp16(b));
  if (qtype == kQ8_0) {
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
    return;
  }
  const uint8_t* qs = b + (qtype == kQ4_1 ? 4 : 2);
  if (qtype == kQ4_0) {
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      out[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
    return;
  }
  const float m = fp16_to_f32(load_fp16(b + 2));
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    out[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

}  // namespace

void gguf_dequant_scalar(const DequantArgs& a) {
  const int bb = gguf_block_bytes(a.qtype);
  float tmp[32];
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* src = a.src + r * a.src_stride;
    for (int64_t c = 0; c < a.cols; c += 32, src += bb) {
      dequant_block(a.qtype, src, tmp);
      if (a.dtype == DType::F32) {
        float* dst = static_cast<float*>(a.dst) + r * a.dst_stride + c;
        for (int j = 0; j < 32; ++j) dst[j] = tmp[j];
      } else {
        uint16_t* dst = static_cast<uint16_t*>(a.dst) + r * a.dst_stride + c;
        for (int j = 0; j < 32; ++j) dst[j] = f32_to_bf16(tmp[j]);
      }
    }
  }
}

void gguf_dequant(const DequantArgs& a) {
  if (gguf_block_bytes(a.qtype) == 0)
    throw std::invalid_argument("gguf_dequant: unsupported qtype " + std::to_string(a.qtype) +
                                "; supported: Q4_0=2, Q4_1=3, Q8_0=8");
  if (a.cols <= 0 || a.cols % 32 != 0 || a.rows < 0)
    throw std::invalid_argument("gguf_dequant: cols must be a positive multiple of 32 and rows >= 0");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16)
    throw std::invalid_argument("gguf_dequant: output dtype must be fp32 or bf16");
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return gguf_dequant_avx512(a);
    case Isa::Avx2: return gguf_dequant_avx2(a);
#endif
    default: return gguf_dequant_scalar(a);
  }
}

}  // namespace engine_cpu
