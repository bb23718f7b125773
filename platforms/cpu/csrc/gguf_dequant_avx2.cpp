// AVX2 GGUF dequantize: one 32-element block = four 8-lane vectors.
#include "gguf_dequant.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX2 inline void store8(void* dst, int64_t off, __m256 v) {
  if (kBf16) bf16x8_store(static_cast<uint16_t*>(dst) + off, v);
  else _mm256_storeu_ps(static_cast<float*>(dst) + off, v);
}

// The low 8 bytes of v, signed (Q4_0 after -8, Q8_0) or unsigned (Q4_1), as 8 floats.
template <bool kSigned>
ENGINE_AVX2 inline __m256 bytes8(__m128i v) {
  return _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

template <int kQ>
ENGINE_AVX2 inline void block(const uint8_t* b, __m256 out[4]) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_fp16(b)));
  __m128i q[4];
  if (kQ == kQ8_0) {
    for (int i = 0; i < 4; ++i) q[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
  } else {
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (kQ == kQ4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0f);
    __m128i ql = _mm_and_si128(qs, mask), qh = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
    if (kQ == kQ4_0) {
      ql = _mm_sub_epi8(ql, _mm_set1_epi8(8));
      qh = _mm_sub_epi8(qh, _mm_set1_epi8(8));
    }
    q[0] = ql;
    q[1] = _mm_srli_si128(ql, 8);
    q[2] = qh;
    q[3] = _mm_srli_si128(qh, 8);
  }
  if (kQ == kQ4_1) {
    const __m256 m = _mm256_set1_ps(_cvtsh_ss(load_fp16(b + 2)));
    for (int i = 0; i < 4; ++i) out[i] = _mm256_add_ps(_mm256_mul_ps(bytes8<false>(q[i]), d), m);
  } else {
    for (int i = 0; i < 4; ++i) out[i] = _mm256_mul_ps(bytes8<true>(q[i]), d);
  }
}

template <int kQ, bool kBf16>
ENGINE_AVX2 void run(const DequantArgs& a) {
  const int bb = gguf_block_bytes(kQ);
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* src = a.src + r * a.src_stride;
    const int64_t base = r * a.dst_stride;
    for (int64_t c = 0; c < a.cols; c += 32, src += bb) {
      __m256 v[4];
      block<kQ>(src, v);
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
