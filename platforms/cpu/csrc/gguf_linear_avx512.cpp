// AVX-512 kernels for the fused GGUF linear (16 fp32 lanes; a block of 32 = two vectors).
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers seed results with _mm512_undefined_*() and then warn about it once the
// intrinsics are inlined into these kernels (GCC bug 105593): silence it for the headers too.
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "gguf_dequant.h"
#include "gguf_linear.h"
#include "simd_x86.h"

#ifdef ENGINE_X86
namespace engine_cpu {
namespace {

// Q4 blocks: the 16 possible values of a block (q * d + m, or (q - 8) * d) are computed once into
// a 16-lane table, and each nibble picks its value with vpermps, which reads only the low 4 bits
// of each index lane: the zero-extended byte indexes its low nibble, the byte >> 4 its high one.
// That replaces the int->float conversion and scaling of 32 values by one table build per block,
// and the values equal the reference's bit for bit (same multiply, same add).
template <int kQ>
ENGINE_AVX512 void decode_q(const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst,
                            const float* lut) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
  const int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* b = w + r * w_stride;
    float* out = dst + r * k;
    for (int64_t c = 0; c < k; c += 32, b += bb, out += 32) {
      const __m512 d = _mm512_set1_ps(lut[load_fp16(b)]);
      __m512 lo, hi;
      if (kQ == kQ8_0) {
        const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
        const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
        lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
      } else {
        const __m512i q = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (kQ == kQ4_1 ? 4 : 2))));
        const __m512 table = kQ == kQ4_0 ? _mm512_mul_ps(iota8, d)
                                         : _mm512_add_ps(_mm512_mul_ps(iota, d), _mm512_set1_ps(lut[load_fp16(b + 2)]));
        lo = _mm512_permutexvar_ps(q, table);
        hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
      }
      _mm512_storeu_ps(out, lo);
      _mm512_storeu_ps(out + 16, hi);
    }
  }
}

void decode(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, float* dst, const float* lut) {
  with_qtype(qtype, [&](auto q) { decode_q<decltype(q)::value>(w, w_stride, rows, k, dst, lut); });
}

// MT rows of x against the 4-row panel. U independent accumulator sets hide the FMA latency when
// MT is small (one FMA chain per accumulator).
template <int MT, int U>
ENGINE_AVX512 void dot_t(const float* x, int64_t xs, const float* w, int64_t k, float* out) {
  static_assert(kPanelRows == 4, "the accumulator layout assumes 4 panel rows");
  __m512 acc[U][MT][4];
#pragma GCC unroll 64
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 64
    for (int i = 0; i < MT; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[u][i][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; c += 16 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 16 * u;
      const __m512 w0 = _mm512_loadu_ps(w + cc), w1 = _mm512_loadu_ps(w + k + cc);
      const __m512 w2 = _mm512_loadu_ps(w + 2 * k + cc), w3 = _mm512_loadu_ps(w + 3 * k + cc);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const __m512 xv = _mm512_loadu_ps(x + i * xs + cc);
        acc[u][i][0] = _mm512_fmadd_ps(w0, xv, acc[u][i][0]);
        acc[u][i][1] = _mm512_fmadd_ps(w1, xv, acc[u][i][1]);
        acc[u][i][2] = _mm512_fmadd_ps(w2, xv, acc[u][i][2]);
        acc[u][i][3] = _mm512_fmadd_ps(w3, xv, acc[u][i][3]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[0][i][j] = _mm512_add_ps(acc[0][i][j], acc[u][i][j]);
    _mm_storeu_ps(out + i * 4, hsum4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]));
  }
}

void dot(const float* x, int64_t xs, int mt, const float* w, int64_t k, float* out) {
  switch (mt) {
    case 1: return dot_t<1, 2>(x, xs, w, k, out);
    case 2: return dot_t<2, 2>(x, xs, w, k, out);
    case 3: return dot_t<3, 1>(x, xs, w, k, out);
    case 4: return dot_t<4, 1>(x, xs, w, k, out);
    case 5: return dot_t<5, 1>(x, xs, w, k, out);
    default: return dot_t<6, 1>(x, xs, w, k, out);
  }
}

// M = 1: R rows at once (independent FMA chains), each block decoded in registers. Q4 values come
// from a table built with one FMA (q * d + m fused: within an ulp of the reference's value);
// Q8_0 accumulates d * (q . x) per block, one multiply fewer than scaling every value.
template <int kQ, int R>
ENGINE_AVX512 void gemv_rows(const uint8_t* w, int64_t w_stride, int64_t k, const float* x, float* out,
                             const float* lut) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
  const int bb = kQ == kQ8_0 ? 34 : kQ == kQ4_1 ? 20 : 18;
  __m512 acc[R][2];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t c = 0, off = 0; c < k; c += 32, off += bb) {
    const __m512 xlo = _mm512_loadu_ps(x + c), xhi = _mm512_loadu_ps(x + c + 16);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const uint8_t* b = w + i * w_stride + off;
      // The next R rows (prefetch never faults, past the end too): several times the bandwidth of
      // the hardware prefetcher alone on the 30 MB LM head, measured.
      _mm_prefetch(reinterpret_cast<const char*>(b + R * w_stride), _MM_HINT_T0);
      const __m512 d = _mm512_set1_ps(lut[load_fp16(b)]);
      if (kQ == kQ8_0) {
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2))));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18))));
        acc[i][0] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, xhi, _mm512_mul_ps(lo, xlo)), d, acc[i][0]);
      } else {
        const __m512i q = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (kQ == kQ4_1 ? 4 : 2))));
        const __m512 table = kQ == kQ4_0 ? _mm512_mul_ps(iota8, d)
                                         : _mm512_fmadd_ps(iota, d, _mm512_set1_ps(lut[load_fp16(b + 2)]));
        acc[i][0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q, table), xlo, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table), xhi, acc[i][1]);
      }
    }
  }
  if (R == 4) {
    _mm_storeu_ps(out, hsum4(_mm512_add_ps(acc[0][0], acc[0][1]), _mm512_add_ps(acc[1 % R][0], acc[1 % R][1]),
                             _mm512_add_ps(acc[2 % R][0], acc[2 % R][1]), _mm512_add_ps(acc[3 % R][0], acc[3 % R][1])));
  } else {
    for (int i = 0; i < R; ++i) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
  }
}

template <int kQ>
void gemv_q(const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out, const float* lut) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) gemv_rows<kQ, 4>(w + r * w_stride, w_stride, k, x, out + r, lut);
  for (; r < rows; ++r) gemv_rows<kQ, 1>(w + r * w_stride, w_stride, k, x, out + r, lut);
}

void gemv(int qtype, const uint8_t* w, int64_t w_stride, int rows, int64_t k, const float* x, float* out,
          const float* lut) {
  with_qtype(qtype, [&](auto q) { gemv_q<decltype(q)::value>(w, w_stride, rows, k, x, out, lut); });
}

}  // namespace

GgufLinearKernels gguf_linear_kernels_avx512() { return {decode, dot, gemv}; }

}  // namespace engine_cpu
#endif  // ENGINE_X86
