// AVX-512 GGUF dequantize: one 32-element block = two 16-lane vectors (elements 0..15, 16..31).
#include "gguf_dequant.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

template <bool kBf16>
ENGINE_AVX512 inline void store16(void* dst, int64_t off, __m512 v) {
  if (kBf16) bf16x16_store(static_cast<uint16_t*>(dst) + off, v, static_cast<__mmask16>(0xffff));
  else _mm512_storeu_ps(static_cast<float*>(dst) + off, v);
}

template <int kQ>
ENGINE_AVX512 inline void block(const uint8_t* b, __m512* lo, __m512* hi) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(load_fp16(b)));
  if (kQ == kQ8_0) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
    return;
  }
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (kQ == kQ4_1 ? 4 : 2)));
  const __m128i mask = _mm_set1_epi8(0x0f);
  __m128i ql = _mm_and_si128(qs, mask), qh = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
  if (kQ == kQ4_0) {
    const __m128i eight = _mm_set1_epi8(8);
    ql = _mm_sub_epi8(ql, eight);
    qh = _mm_sub_epi8(qh, eight);
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ql)), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qh)), d);
    return;
  }
  const __m512 m = _mm512_set1_ps(_cvtsh_ss(load_fp16(b + 2)));
  *lo = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ql)), d), m);
  *hi = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(qh)), d), m);
}

template <int kQ, bool kBf16>
ENGINE_AVX512 void run(const DequantArgs& a) {
  const int bb = gguf_block_bytes(kQ);
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* src = a.src + r * a.src_stride;
    const int64_t base = r * a.dst_stride;
    for (int64_t c = 0; c < a.cols; c += 32, src += bb) {
      __m512 lo, hi;
      block<kQ>(src, &lo, &hi);
      store16<kBf16>(a.dst, base + c, lo);
      store16<kBf16>(a.dst, base + c + 16, hi);
    }
  }
}

template <int kQ>
void run_q(const DequantArgs& a) {
  if (a.dtype == DType::BF16) run<kQ, true>(a);
  else run<kQ, false>(a);
}

}  // namespace

void gguf_dequant_avx512(const DequantArgs& a) {
  switch (a.qtype) {
    case kQ4_0: return run_q<kQ4_0>(a);
    case kQ4_1: return run_q<kQ4_1>(a);
    default: return run_q<kQ8_0>(a);
  }
}

}  // namespace engine_cpu
#endif  // ENGINE_X86
