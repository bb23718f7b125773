// AVX2 GGUF dequantize: one 32-element block = four 8-lane vectors.
#include "gguf_dequant.h"
#include "gguf_block_avx2.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX2 inline void store8(void* dst, int64_t off, __m256 v) {
  if (kBf16) bf16x8_store(static_cast<uint16_t*>(dst) + off, v);
  else _mm256_storeu_ps(static_cast<float*>(dst) + off, v);
}

template <int kQ, bool kBf16>
ENGINE_AVX2 void run(const DequantArgs& a) {
  const int bb = gguf_block_bytes(kQ);
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* src = a.src + r * a.src_stride;
    const int64_t base = r * a.dst_stride;
    for (int64_t c = 0; c < a.cols; c += 32, src += bb) {
      __m256 v[4];
      gguf_avx2::decode_block<kQ>(src, v);
      for (int i = 0; i < 4; ++i) store8<kBf16>(a.dst, base + c + 8 * i, v[i]);
    }
  }
}

template <int kQ>
void run_q(const DequantArgs& a) {
  if (a.dtype == DType::BF16) run<kQ, true>(a);
  else run<kQ, false>(a);
}

}  // namespace

void gguf_dequant_avx2(const DequantArgs& a) {
  switch (a.qtype) {
    case kQ4_0: return run_q<kQ4_0>(a);
    case kQ4_1: return run_q<kQ4_1>(a);
    default: return run_q<kQ8_0>(a);
  }
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
