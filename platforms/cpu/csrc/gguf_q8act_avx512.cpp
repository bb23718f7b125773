// AVX-512 VNNI kernels of the Q8-activation GGUF linear: two blocks (64 int8) per vector, vpdpbusd
// (u8 x s8 -> s32) for the block dots. The driver uses them only where the CPU has AVX512_VNNI; an
// AVX-512 CPU without it runs the AVX2 kernels.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see gguf_linear_avx512.cpp
#endif
#include "gguf_dequant.h"
#include "gguf_linear.h"
#include "gguf_q8act.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

constexpr int kLanes = 8;  // each block's d and s stored 8 times: a pair of blocks loads as one vector

ENGINE_AVX512VNNI void quantize(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * b), hi = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, lo), _mm512_andnot_ps(sign, hi)));
    const float db = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(db > 0.0f ? 1.0f / db : 0.0f);
    // cvtps rounds half to even (the default MXCSR mode); |x * inv| <= 127 so the int8 narrowing is exact.
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(qhi));
    const float sb = db * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    _mm256_storeu_ps(d + kLanes * b, _mm256_set1_ps(db));
    _mm256_storeu_ps(s + kLanes * b, _mm256_set1_ps(sb / kLanes));
  }
}

// Weight bytes of a pair of blocks as 64 unsigned values in x's element order, plus (Q8_0) the sign
// mask of the weights: Q8_0 multiplies |w| by x with w's sign, keeping vpdpbusd's u8 x s8 form.
template <int kQ>
ENGINE_AVX512VNNI inline __m512i load_pair(const uint8_t* pa, const uint8_t* pb, __mmask64* neg) {
  if (kQ == kQ8_0) {
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2)), 1);
    *neg = _mm512_movepi8_mask(w);
    return _mm512_abs_epi8(w);
  }
  const int off = kQ == kQ4_1 ? 4 : 2;
  const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + off)));
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + off)));
  // 128-bit quarters [a, a, b, b]; shifting the 2nd and 4th by 4 puts each block's high nibbles
  // (elements 16..31) after its low ones.
  const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  return _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(0x0f));
}

ENGINE_AVX512VNNI inline __m512 pair_scale(const float* lut, const uint8_t* pa, const uint8_t* pb, int off) {
  return _mm512_insertf32x8(_mm512_set1_ps(lut[load_fp16(pa + off)]), _mm256_set1_ps(lut[load_fp16(pb + off)]), 1);
}

// MT rows of x (from row x0) against 4 weight rows; rows past `rows` repeat the last one (discarded).
template <int kQ, int MT>
ENGINE_AVX512VNNI void tile_t(const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, float* out,
                              const float* lut) {
  const int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  const int64_t nb = x.k / 32, dstride = nb * kLanes;
  const uint8_t* wr[4];
  for (int j = 0; j < 4; ++j) wr[j] = w + (j < rows ? j : rows - 1) * ws;
  const int8_t* xq = x.q + x0 * x.k;
  const float* xd = x.d + x0 * dstride;
  const float* xs = x.s + x0 * dstride;
  __m512 acc[MT][4];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const uint8_t* pa = wr[j] + b * bb;
      _mm_prefetch(reinterpret_cast<const char*>(pa + 4 * ws), _MM_HINT_T0);  // the next panel's rows
      __mmask64 neg = 0;
      const __m512i wv = load_pair<kQ>(pa, pa + bb, &neg);
      const __m512 dw = pair_scale(lut, pa, pa + bb, 0);
      __m512 mw = _mm512_setzero_ps();
      if (kQ == kQ4_1) mw = pair_scale(lut, pa, pa + bb, 2);
      if (kQ == kQ4_0) mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        __m512i xv = _mm512_loadu_si512(xq + i * x.k + 32 * b);
        if (kQ == kQ8_0) xv = _mm512_mask_sub_epi8(xv, neg, zero, xv);
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, wv, xv));
        const float* ds = xd + i * dstride + kLanes * b;
        acc[i][j] = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, _mm512_loadu_ps(ds)), acc[i][j]);
        if (kQ != kQ8_0) acc[i][j] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(xs + i * dstride + kLanes * b), acc[i][j]);
      }
    }
  }
  if (b < nb) {  // an odd last block: the same with 256-bit vectors
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const uint8_t* pa = wr[j] + b * bb;
      __m256i wv;
      __mmask32 neg = 0;
      if (kQ == kQ8_0) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2));
        neg = _mm256_movepi8_mask(raw);
        wv = _mm256_abs_epi8(raw);
      } else {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + (kQ == kQ4_1 ? 4 : 2)));
        wv = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1),
                              _mm256_set1_epi8(0x0f));
      }
      const __m256 dw = _mm256_set1_ps(lut[load_fp16(pa)]);
      const __m256 mw = kQ == kQ4_1 ? _mm256_set1_ps(lut[load_fp16(pa + 2)]) : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i * x.k + 32 * b));
        if (kQ == kQ8_0) xv = _mm256_mask_sub_epi8(xv, neg, _mm256_setzero_si256(), xv);
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), wv, xv));
        __m256 t = _mm256_mul_ps(dot, _mm256_mul_ps(dw, _mm256_loadu_ps(xd + i * dstride + kLanes * b)));
        if (kQ != kQ8_0) t = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xs + i * dstride + kLanes * b), t);
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_zextps256_ps512(t));
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) _mm_storeu_ps(out + i * 4, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

void tile(int qtype, const uint8_t* w, int64_t ws, int rows, const Q8Rows& x, int64_t x0, int mt, float* out,
          const float* lut) {
  with_qtype(qtype, [&](auto q) {
    constexpr int kQ = decltype(q)::value;
    if (mt == 1) return tile_t<kQ, 1>(w, ws, rows, x, x0, out, lut);
    if (mt == 2) return tile_t<kQ, 2>(w, ws, rows, x, x0, out, lut);
    if (mt == 3) return tile_t<kQ, 3>(w, ws, rows, x, x0, out, lut);
    if (mt == 4) return tile_t<kQ, 4>(w, ws, rows, x, x0, out, lut);
    if (mt == 5) return tile_t<kQ, 5>(w, ws, rows, x, x0, out, lut);
    tile_t<kQ, 6>(w, ws, rows, x, x0, out, lut);
  });
}

}  // namespace

GgufQ8Kernels gguf_q8_kernels_avx512() { return {kLanes, 6, quantize, tile}; }

}  // namespace engine_cpu
#endif  // ENGINE_X86
