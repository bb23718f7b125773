// The vector layer's integer and quantized-block members: each fixed-width backend of vec.h derives from
// its base here (VecAvx2 : QuantAvx2, ...), so a kernel sees one abstraction, `V::member`. Included by vec.h
// only (after the intrinsics headers); the members are static inline with the backend's target attribute.
//
// fp32 widening (the fp32-activation GGUF linear), W = V::W lanes:
//   from_i8(p)   W signed bytes at p as W floats; from_u8(p) W unsigned bytes;
//   from_u4lo(p) / from_u4hi(p) the low / high nibbles of the W bytes at p (0..15);
//   from_bits<S, M>(p) (byte >> S) & M of the W bytes at p (the K-quants' high bits);
//   kBlockLoads: whether q4_block / q8_block exist (where widening a whole 32-value block from 16-byte loads
//     beats 32 / W loads of W bytes): q4_block(qs, q, whole) = a Q4 block's 16 bytes as 32 / W vectors, low
//     nibbles (values 0..15) then high nibbles, or with `whole` the whole bytes; q8_block(p, q) = 32 int8;
//   kLut16: whether lut16_lo(t, p) / lut16_hi(t, p) exist (W = 16): lane l = lane (p[l] & 15) / (p[l] >> 4)
//     of the 16-lane table t, one permute instead of an int -> float conversion.
// Block scales: kFp16Scalar: whether fp16_scalar(h) exists, one fp16 (bits h) converted to fp32 in a register
//   (F16C); kernels without it look the scale up in fp16_lut().
// Integers (the Q8-activation linear): I = W int32 lanes and B = 4W bytes, the same register;
//   zero_i, add_i, to_f32 (exact below 2^24), reduce_add_i, round_i (fp32 -> int32, nearest even);
//   load_b(p) = 4W bytes; store_i8_block(p, v) = the 32 int32 lanes of v[0 .. 32 / W), each in -128..127, as
//   32 bytes;
//   dot_u8s8(acc, u, s) = acc plus, in each int32 lane, four products u * s of bytes in that lane's 128-bit
//     quarter (u unsigned 0..127, s signed): vpdpbusd on AVX-512 VNNI (VecAvx512Vnni), vpmaddubsw + vpmaddwd
//     on AVX2, SDOT on Armv8.2 dotprod (VecNeonDot), widening multiply-adds on plain NEON, vmsummbm on VSX,
//     plain C on the portable backend; dot_s8s8(acc, a, b) the same for signed a (-128..127) and b
//     (-127..127): x86 and VSX multiply |a| by b carrying a's sign;
//   Blocks of 32 quants: a kernel steps over kQ8Blocks blocks at a time, held in kQ8Regs byte vectors
//   (kQ8Blocks * 32 = kQ8Regs * 4W: AVX-512 two blocks per vector, AVX2 one, the 16-byte backends one in two).
//   q4_bytes<N>(qs, stride, out) = N <= kQ8Blocks Q4 blocks (16 bytes each, at qs + g * stride) as their 32
//   values 0..15 (byte j's low nibble is value j, its high nibble value 16 + j), in the order of 32 int8
//   activations; i8_bytes<N>(p, stride, out) the same for 32 bytes per block; set1_blocks<N>(v0, v1) the fp32
//   vector whose lanes of block g (W / kQ8Blocks each) are v_g (kQ8Blocks <= 2). Blocks g >= N are zero.
// Row-interleaved weights (gguf_packed_impl.h; x86 and the portable backend only): each int32 lane of B holds 4
//   bytes of its own weight row. bcast4_b(p) = the 4 bytes at p in every int32 lane; set1_i(v) = v in every
//   int32 lane; u4_lo_b(v) / u4_hi_b(v) = the low / high nibble of each byte (0..15); xor80_b(v) = each byte
//   xor 0x80 (a signed byte s as the unsigned s + 128); kDotU8Full: whether dot_u8s8 is exact for u up to 255
//   (vpdpbusd, plain C; not AVX2's vpmaddubsw, whose 16-bit pair sums saturate); kI16Sums: whether the next
//   three exist (AVX2, where they save a vpmaddwd per product vector): madd_i16(u, s) = the int16 pair sums of
//   u * s (u unsigned, s signed, each sum within int16), add_i16(a, b) int16 lanes added, widen_add_i16(acc, v) =
//   acc plus, per int32 lane, its two int16 lanes of v. hold(v): nothing, but the compiler cannot see through it,
//   so a chain of integer adds into v keeps its order (AVX2: GCC otherwise reassociated a block's 8 sums into a
//   tree that kept all 8 products live; with 16 registers that spilled a third of the tile's vector instructions,
//   and 4-32 rows of x ran 1.1-1.5x slower, Zen 5, 2026-12-02); a plain no-op elsewhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace engine_cpu {
namespace {

struct QuantScalar {
  struct F {
    float v[4];
  };
  struct I {
    int32_t v[4];
  };
  struct B {
    int8_t v[16];
  };
  static constexpr int kQ8Blocks = 1, kQ8Regs = 2;
  static F from_i8(const int8_t* p) { return F{{float(p[0]), float(p[1]), float(p[2]), float(p[3])}}; }
  static F from_u4lo(const uint8_t* p) {
    return F{{float(p[0] & 15), float(p[1] & 15), float(p[2] & 15), float(p[3] & 15)}};
  }
  static F from_u4hi(const uint8_t* p) {
    return F{{float(p[0] >> 4), float(p[1] >> 4), float(p[2] >> 4), float(p[3] >> 4)}};
  }
  static F from_u8(const uint8_t* p) { return F{{float(p[0]), float(p[1]), float(p[2]), float(p[3])}}; }
  template <int S, int M>
  static F from_bits(const uint8_t* p) {
    return F{{float((p[0] >> S) & M), float((p[1] >> S) & M), float((p[2] >> S) & M), float((p[3] >> S) & M)}};
  }
  static constexpr bool kLut16 = false;
  static constexpr bool kBlockLoads = false;
  static constexpr bool kFp16Scalar = false;

  static I zero_i() { return I{{0, 0, 0, 0}}; }
  static I add_i(I a, I b) { return I{{a.v[0] + b.v[0], a.v[1] + b.v[1], a.v[2] + b.v[2], a.v[3] + b.v[3]}}; }
  static F to_f32(I a) { return F{{float(a.v[0]), float(a.v[1]), float(a.v[2]), float(a.v[3])}}; }
  static int32_t reduce_add_i(I a) { return (a.v[0] + a.v[1]) + (a.v[2] + a.v[3]); }
  static I round_i(F x) {  // nearbyint: half to even in the default rounding mode
    I r;
    for (int l = 0; l < 4; ++l) r.v[l] = static_cast<int32_t>(std::nearbyint(x.v[l]));
    return r;
  }
  static B load_b(const void* p) {
    B r;
    std::memcpy(r.v, p, 16);
    return r;
  }
  static void store_i8_block(int8_t* p, const I* v) {
    for (int j = 0; j < 32; ++j) p[j] = static_cast<int8_t>(v[j / 4].v[j % 4]);
  }
  static I dot_u8s8(I acc, B u, B s) {
    for (int l = 0; l < 4; ++l)
      for (int t = 4 * l; t < 4 * l + 4; ++t) acc.v[l] += static_cast<uint8_t>(u.v[t]) * s.v[t];
    return acc;
  }
  static I dot_s8s8(I acc, B a, B b) {
    for (int l = 0; l < 4; ++l)
      for (int t = 4 * l; t < 4 * l + 4; ++t) acc.v[l] += a.v[t] * b.v[t];
    return acc;
  }
  template <int N>
  static void q4_bytes(const uint8_t* qs, int64_t, B* out) {
    static_assert(N == 1, "one block per step");
    for (int j = 0; j < 16; ++j) {
      out[0].v[j] = static_cast<int8_t>(qs[j] & 15);
      out[1].v[j] = static_cast<int8_t>(qs[j] >> 4);
    }
  }
  template <int N>
  static void i8_bytes(const uint8_t* p, int64_t, B* out) {
    static_assert(N == 1, "one block per step");
    out[0] = load_b(p), out[1] = load_b(p + 16);
  }
  template <int N>
  static F set1_blocks(float v0, float) {
    static_assert(N == 1, "one block per step");
    return F{{v0, v0, v0, v0}};
  }
  static constexpr bool kDotU8Full = true;
  static constexpr bool kI16Sums = false;
  template <class T>
  static void hold(T&) {}
  static B bcast4_b(const void* p) {
    B r;
    for (int l = 0; l < 4; ++l) std::memcpy(r.v + 4 * l, p, 4);
    return r;
  }
  static I set1_i(int32_t v) { return I{{v, v, v, v}}; }
  static B u4_lo_b(B v) {
    for (auto& b : v.v) b = static_cast<int8_t>(static_cast<uint8_t>(b) & 15);
    return v;
  }
  static B u4_hi_b(B v) {
    for (auto& b : v.v) b = static_cast<int8_t>(static_cast<uint8_t>(b) >> 4);
    return v;
  }
  static B xor80_b(B v) {
    for (auto& b : v.v) b = static_cast<int8_t>(static_cast<uint8_t>(b) ^ 0x80);
    return v;
  }
  // Packed fp32 linear (gguf_packed_f32_impl.h): int32 lanes loaded from bytes; nibble t (bits 4t .. 4t + 3) of
  // each lane as fp32, plus the table's first value where kNibTable (a 16-entry lookup: nib_table(first) holds
  // first .. first + 15; backends without it ignore the table and give the nibble itself), times 2^(4t) for t < 7
  // where kNibScaled (the nibble masked in place, not shifted down: exact in fp32; the caller scales x by
  // 2^(-4t)); signed byte t of each lane as fp32. Where kNibInPlace, nib_f32_in_place gives the nibble masked in
  // place whatever nib_f32 does (the caller scales x), for tiles where that is the cheaper decode.
  static constexpr bool kNibTable = false, kNibScaled = false, kNibInPlace = false;
  static I load_i(const void* p) {
    I r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static F nib_table(float) { return F{{0.0f, 0.0f, 0.0f, 0.0f}}; }
  static F nib_f32(I v, int t, F) {
    F r;
    for (int l = 0; l < 4; ++l) r.v[l] = static_cast<float>((static_cast<uint32_t>(v.v[l]) >> (4 * t)) & 15);
    return r;
  }
  static F s8_f32(I v, int t) {
    F r;
    for (int l = 0; l < 4; ++l) r.v[l] = static_cast<float>(static_cast<int8_t>(static_cast<uint32_t>(v.v[l]) >> (8 * t)));
    return r;
  }
};

#ifdef ENGINE_X86
struct QuantAvx2 {
  using F = __m256;
  using I = __m256i;
  using B = __m256i;
  static constexpr int kQ8Blocks = 1, kQ8Regs = 1;
  ENGINE_AVX2 static __m256i u8x8(const void* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  ENGINE_AVX2 static F from_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  ENGINE_AVX2 static F from_u4lo(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(u8x8(p), _mm256_set1_epi32(0x0f)));
  }
  ENGINE_AVX2 static F from_u4hi(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(u8x8(p), 4)); }
  ENGINE_AVX2 static F from_u8(const uint8_t* p) { return _mm256_cvtepi32_ps(u8x8(p)); }
  template <int S, int M>
  ENGINE_AVX2 static F from_bits(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(u8x8(p), S), _mm256_set1_epi32(M)));
  }
  static constexpr bool kLut16 = false;  // a 16-entry table is two ymm registers: 2 permutes + a blend
  static constexpr bool kBlockLoads = false;
  static constexpr bool kFp16Scalar = true;
  ENGINE_AVX2 static float fp16_scalar(uint16_t h) { return _cvtsh_ss(h); }

  ENGINE_AVX2 static I zero_i() { return _mm256_setzero_si256(); }
  ENGINE_AVX2 static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  ENGINE_AVX2 static F to_f32(I a) { return _mm256_cvtepi32_ps(a); }
  ENGINE_AVX2 static int32_t reduce_add_i(I a) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return _mm_cvtsi128_si32(t);
  }
  ENGINE_AVX2 static I round_i(F x) { return _mm256_cvtps_epi32(x); }  // MXCSR's default: half to even
  ENGINE_AVX2 static B load_b(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  ENGINE_AVX2 static void store_i8_block(int8_t* p, const I* v) {
    // Packs interleave 128-bit halves; the permute puts the 32 bytes back in order.
    const __m256i a = _mm256_packs_epi32(v[0], v[1]), b = _mm256_packs_epi32(v[2], v[3]);
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), q);
  }
  // No 16-bit pair sum saturates: |u * s| <= 127 * 128 twice.
  ENGINE_AVX2 static I dot_u8s8(I acc, B u, B s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  ENGINE_AVX2 static I dot_s8s8(I acc, B a, B b) { return dot_u8s8(acc, _mm256_abs_epi8(a), _mm256_sign_epi8(b, a)); }
  template <int N>
  ENGINE_AVX2 static void q4_bytes(const uint8_t* qs, int64_t, B* out) {
    static_assert(N == 1, "one block per vector");
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    out[0] = _mm256_and_si256(w, _mm256_set1_epi8(0x0f));
  }
  template <int N>
  ENGINE_AVX2 static void i8_bytes(const uint8_t* p, int64_t, B* out) {
    static_assert(N == 1, "one block per vector");
    out[0] = load_b(p);
  }
  template <int N>
  ENGINE_AVX2 static F set1_blocks(float v0, float) {
    static_assert(N == 1, "one block per vector");
    return _mm256_set1_ps(v0);
  }
  static constexpr bool kDotU8Full = false;
  static constexpr bool kI16Sums = true;
  ENGINE_AVX2 static void hold(__m256i& v) { __asm__("" : "+x"(v)); }
  ENGINE_AVX2 static B madd_i16(B u, B s) { return _mm256_maddubs_epi16(u, s); }
  ENGINE_AVX2 static B add_i16(B a, B b) { return _mm256_add_epi16(a, b); }
  ENGINE_AVX2 static I widen_add_i16(I acc, B v) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(v, _mm256_set1_epi16(1)));
  }
  ENGINE_AVX2 static B bcast4_b(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  ENGINE_AVX2 static I set1_i(int32_t v) { return _mm256_set1_epi32(v); }
  ENGINE_AVX2 static B u4_lo_b(B v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
  ENGINE_AVX2 static B u4_hi_b(B v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }
  ENGINE_AVX2 static B xor80_b(B v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }
  // mask, convert (the top nibble: shift, convert)
  static constexpr bool kNibTable = false, kNibScaled = true, kNibInPlace = true;
  ENGINE_AVX2 static I load_i(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  ENGINE_AVX2 static F nib_table(float) { return _mm256_setzero_ps(); }
  // The masks as memory operands: as set1 constants GCC rebuilt them in the loop (3 instructions each, for lack of
  // registers); the empty asm hides the table's values from it (one scalar lea instead).
  alignas(32) static constexpr int32_t kNibMask[7][8] = {
      {15, 15, 15, 15, 15, 15, 15, 15}, {15 << 4, 15 << 4, 15 << 4, 15 << 4, 15 << 4, 15 << 4, 15 << 4, 15 << 4},
      {15 << 8, 15 << 8, 15 << 8, 15 << 8, 15 << 8, 15 << 8, 15 << 8, 15 << 8},
      {15 << 12, 15 << 12, 15 << 12, 15 << 12, 15 << 12, 15 << 12, 15 << 12, 15 << 12},
      {15 << 16, 15 << 16, 15 << 16, 15 << 16, 15 << 16, 15 << 16, 15 << 16, 15 << 16},
      {15 << 20, 15 << 20, 15 << 20, 15 << 20, 15 << 20, 15 << 20, 15 << 20, 15 << 20},
      {15 << 24, 15 << 24, 15 << 24, 15 << 24, 15 << 24, 15 << 24, 15 << 24, 15 << 24}};
  ENGINE_AVX2 static F nib_f32(I v, int t, F) {
    if (t == 7) return _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 28));
    const int32_t* mask = kNibMask[t];
    __asm__("" : "+r"(mask));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(mask))));
  }
  ENGINE_AVX2 static F nib_f32_in_place(I v, int t) { return nib_f32(v, t, _mm256_setzero_ps()); }
  ENGINE_AVX2 static F s8_f32(I v, int t) {
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * t), 24));
  }
};

struct QuantAvx512 {
  using F = __m512;
  using I = __m512i;
  using B = __m512i;
  static constexpr int kQ8Blocks = 2, kQ8Regs = 1;
  ENGINE_AVX512 static __m512i u8x16(const void* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ENGINE_AVX512 static F from_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  ENGINE_AVX512 static F from_u4lo(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(u8x16(p), _mm512_set1_epi32(0x0f)));
  }
  ENGINE_AVX512 static F from_u4hi(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(u8x16(p), 4)); }
  ENGINE_AVX512 static F from_u8(const uint8_t* p) { return _mm512_cvtepi32_ps(u8x16(p)); }
  template <int S, int M>
  ENGINE_AVX512 static F from_bits(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(u8x16(p), S), _mm512_set1_epi32(M)));
  }
  static constexpr bool kLut16 = true;  // vpermps reads the low 4 bits of each index lane
  static constexpr bool kBlockLoads = false;
  static constexpr bool kFp16Scalar = true;
  ENGINE_AVX512 static float fp16_scalar(uint16_t h) { return _cvtsh_ss(h); }
  ENGINE_AVX512 static F lut16_lo(F t, const uint8_t* p) { return _mm512_permutexvar_ps(u8x16(p), t); }
  ENGINE_AVX512 static F lut16_hi(F t, const uint8_t* p) {
    return _mm512_permutexvar_ps(_mm512_srli_epi32(u8x16(p), 4), t);
  }

  // The integer dot needs VNNI: VecAvx512Vnni (vec.h) adds dot_u8s8 / dot_s8s8.
  ENGINE_AVX512 static I zero_i() { return _mm512_setzero_si512(); }
  ENGINE_AVX512 static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  ENGINE_AVX512 static F to_f32(I a) { return _mm512_cvtepi32_ps(a); }
  ENGINE_AVX512 static int32_t reduce_add_i(I a) { return _mm512_reduce_add_epi32(a); }
  ENGINE_AVX512 static I round_i(F x) { return _mm512_cvtps_epi32(x); }
  ENGINE_AVX512 static B load_b(const void* p) { return _mm512_loadu_si512(p); }
  ENGINE_AVX512 static void store_i8_block(int8_t* p, const I* v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(v[0]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16), _mm512_cvtsepi32_epi8(v[1]));
  }
  template <int N>
  ENGINE_AVX512 static void q4_bytes(const uint8_t* qs, int64_t stride, B* out) {
    static_assert(N == 1 || N == 2, "two blocks per vector");
    // 128-bit quarters [a, a, b, b]; shifting the 2nd and 4th by 4 puts each block's high nibbles after its
    // low ones.
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    __m256i b = _mm256_setzero_si256();
    if constexpr (N == 2)
      b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + stride)));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    out[0] = _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(0x0f));
  }
  template <int N>
  ENGINE_AVX512 static void i8_bytes(const uint8_t* p, int64_t stride, B* out) {
    static_assert(N == 1 || N == 2, "two blocks per vector");
    if constexpr (N == 1) {
      out[0] = _mm512_maskz_loadu_epi8(static_cast<__mmask64>(0xffffffffULL), p);
    } else {
      out[0] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + stride)), 1);
    }
  }
  template <int N>
  ENGINE_AVX512 static F set1_blocks(float v0, float v1) {
    static_assert(N == 1 || N == 2, "two blocks per vector");
    if constexpr (N == 1) return _mm512_maskz_mov_ps(0x00ff, _mm512_set1_ps(v0));
    else return _mm512_insertf32x8(_mm512_set1_ps(v0), _mm256_set1_ps(v1), 1);
  }
  static constexpr bool kDotU8Full = true;  // vpdpbusd (VecAvx512Vnni): products and sums in 32 bits
  static constexpr bool kI16Sums = false;
  ENGINE_AVX512 static void hold(__m512i&) {}
  ENGINE_AVX512 static B bcast4_b(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  ENGINE_AVX512 static I set1_i(int32_t v) { return _mm512_set1_epi32(v); }
  ENGINE_AVX512 static B u4_lo_b(B v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
  ENGINE_AVX512 static B u4_hi_b(B v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }
  ENGINE_AVX512 static B xor80_b(B v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
  // nib_f32: vpermps reads the index's low 4 bits (a shift and a lookup); in place: mask, convert (the top nibble:
  // shift, convert), which Zen 5 runs faster once x is scaled anyway (gguf_packed_f32_impl.h).
  static constexpr bool kNibTable = true, kNibScaled = false, kNibInPlace = true;
  ENGINE_AVX512 static I load_i(const void* p) { return _mm512_loadu_si512(p); }
  ENGINE_AVX512 static F nib_table(float first) {
    return _mm512_add_ps(_mm512_set1_ps(first),
                         _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  ENGINE_AVX512 static F nib_f32(I v, int t, F table) {
    return _mm512_permutexvar_ps(t ? _mm512_srli_epi32(v, 4 * t) : v, table);
  }
  ENGINE_AVX512 static F nib_f32_in_place(I v, int t) {
    if (t == 7) return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 28));
    return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15 << (4 * t))));
  }
  ENGINE_AVX512 static F s8_f32(I v, int t) {
    return _mm512_cvtepi32_ps(_mm512_srai_epi32(t == 3 ? v : _mm512_slli_epi32(v, 24 - 8 * t), 24));
  }
};
#endif  // ENGINE_X86

#ifdef ENGINE_ARM64
struct QuantNeon {
  using F = float32x4_t;
  using I = int32x4_t;
  using B = int8x16_t;
  static constexpr int kQ8Blocks = 1, kQ8Regs = 2;
  static uint32x4_t u8x4(const uint8_t* p) {
    uint32_t t;
    std::memcpy(&t, p, 4);
    return vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(t)))));
  }
  static F from_i8(const int8_t* p) {
    uint32_t t;
    std::memcpy(&t, p, 4);
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(t))))));
  }
  static F from_u4lo(const uint8_t* p) { return vcvtq_f32_u32(vandq_u32(u8x4(p), vdupq_n_u32(15))); }
  static F from_u4hi(const uint8_t* p) { return vcvtq_f32_u32(vshrq_n_u32(u8x4(p), 4)); }
  static F from_u8(const uint8_t* p) { return vcvtq_f32_u32(u8x4(p)); }
  template <int S, int M>
  static F from_bits(const uint8_t* p) {
    if constexpr (S == 0) return vcvtq_f32_u32(vandq_u32(u8x4(p), vdupq_n_u32(M)));
    else return vcvtq_f32_u32(vandq_u32(vshrq_n_u32(u8x4(p), S), vdupq_n_u32(M)));
  }
  // Whole blocks from 16-byte loads: widening 16 lanes at a time takes half the instructions of 4-byte loads.
  static constexpr bool kBlockLoads = true;
  static void widen_u8(uint8x16_t v, F* q) {  // 16 unsigned bytes -> 4 vectors
    const uint16x8_t lo = vmovl_u8(vget_low_u8(v)), hi = vmovl_high_u8(v);
    q[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    q[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
    q[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    q[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
  }
  static void widen_s8(int8x16_t v, F* q) {  // 16 signed bytes -> 4 vectors
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    q[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    q[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    q[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    q[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
  }
  static void q4_block(const uint8_t* qs, F* q, bool whole) {
    const uint8x16_t b = vld1q_u8(qs);
    widen_u8(vandq_u8(b, vdupq_n_u8(15)), q);
    widen_u8(whole ? b : vshrq_n_u8(b, 4), q + 4);
  }
  static void q8_block(const int8_t* p, F* q) {
    widen_s8(vld1q_s8(p), q);
    widen_s8(vld1q_s8(p + 16), q + 4);
  }
  static constexpr bool kLut16 = false;
  static constexpr bool kFp16Scalar = false;

  static I zero_i() { return vdupq_n_s32(0); }
  static I add_i(I a, I b) { return vaddq_s32(a, b); }
  static F to_f32(I a) { return vcvtq_f32_s32(a); }
  static int32_t reduce_add_i(I a) { return vaddvq_s32(a); }
  static I round_i(F x) { return vcvtnq_s32_f32(x); }  // to nearest, ties to even
  static B load_b(const void* p) { return vld1q_s8(static_cast<const int8_t*>(p)); }
  static void store_i8_block(int8_t* p, const I* v) {
    for (int u = 0; u < 8; u += 2) vst1_s8(p + 4 * u, vqmovn_s16(vcombine_s16(vqmovn_s32(v[u]), vqmovn_s32(v[u + 1]))));
  }
  // Plain Advanced SIMD: widening multiplies, pairwise accumulated (a Q4 nibble is a valid signed byte).
  static I dot_s8s8(I acc, B a, B b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
  }
  static I dot_u8s8(I acc, B u, B s) { return dot_s8s8(acc, u, s); }
  template <int N>
  static void q4_bytes(const uint8_t* qs, int64_t, B* out) {
    static_assert(N == 1, "one block per step");
    const uint8x16_t v = vld1q_u8(qs);
    out[0] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    out[1] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
  }
  template <int N>
  static void i8_bytes(const uint8_t* p, int64_t, B* out) {
    static_assert(N == 1, "one block per step");
    out[0] = load_b(p), out[1] = load_b(p + 16);
  }
  template <int N>
  static F set1_blocks(float v0, float) {
    static_assert(N == 1, "one block per step");
    return vdupq_n_f32(v0);
  }
};
#endif  // ENGINE_ARM64

#ifdef ENGINE_VSX
struct QuantVsx {
  using F = __vector float;
  using I = __vector signed int;
  using B = __vector signed char;
  using U8 = __vector unsigned char;
  using U4 = __vector unsigned int;
  static constexpr int kQ8Blocks = 1, kQ8Regs = 2;
  static U4 u8x4(const uint8_t* p) { return U4{p[0], p[1], p[2], p[3]}; }
  static F from_i8(const int8_t* p) {
    const I s = {p[0], p[1], p[2], p[3]};
    return vec_ctf(s, 0);
  }
  static F from_u4lo(const uint8_t* p) { return vec_ctf(vec_and(u8x4(p), vec_splats(15u)), 0); }
  static F from_u4hi(const uint8_t* p) { return vec_ctf(vec_sr(u8x4(p), vec_splats(4u)), 0); }
  static F from_u8(const uint8_t* p) { return vec_ctf(u8x4(p), 0); }
  template <int S, int M>
  static F from_bits(const uint8_t* p) {
    return vec_ctf(vec_and(vec_sr(u8x4(p), vec_splats(static_cast<unsigned>(S))), vec_splats(static_cast<unsigned>(M))),
                   0);
  }
  static constexpr bool kLut16 = false;
  static constexpr bool kFp16Scalar = false;
  // Whole blocks from 16-byte loads, widened by merging with zero (unsigned) or unpacking (signed); the
  // merges follow element order, so element 0 is the lowest-addressed byte on either endianness.
  static constexpr bool kBlockLoads = true;
  using U16 = __vector unsigned short;
  static void widen_u8(U8 v, F* q) {
    const U8 z8 = vec_splats(static_cast<unsigned char>(0));
    const U16 z16 = vec_splats(static_cast<unsigned short>(0));
    const U16 lo = reinterpret_cast<U16>(vec_mergeh(v, z8)), hi = reinterpret_cast<U16>(vec_mergel(v, z8));
    q[0] = vec_ctf(reinterpret_cast<U4>(vec_mergeh(lo, z16)), 0);
    q[1] = vec_ctf(reinterpret_cast<U4>(vec_mergel(lo, z16)), 0);
    q[2] = vec_ctf(reinterpret_cast<U4>(vec_mergeh(hi, z16)), 0);
    q[3] = vec_ctf(reinterpret_cast<U4>(vec_mergel(hi, z16)), 0);
  }
  static void widen_s8(B v, F* q) {
    const __vector signed short lo = vec_unpackh(v), hi = vec_unpackl(v);
    q[0] = vec_ctf(vec_unpackh(lo), 0);
    q[1] = vec_ctf(vec_unpackl(lo), 0);
    q[2] = vec_ctf(vec_unpackh(hi), 0);
    q[3] = vec_ctf(vec_unpackl(hi), 0);
  }
  static void q4_block(const uint8_t* qs, F* q, bool whole) {
    const U8 b = vec_xl(0, qs);
    widen_u8(vec_and(b, vec_splats(static_cast<unsigned char>(15))), q);
    widen_u8(whole ? b : vec_sr(b, vec_splats(static_cast<unsigned char>(4))), q + 4);
  }
  static void q8_block(const int8_t* p, F* q) {
    widen_s8(vec_xl(0, p), q);
    widen_s8(vec_xl(16, p), q + 4);
  }

  static I zero_i() { return vec_splats(0); }
  static I add_i(I a, I b) { return vec_add(a, b); }
  static F to_f32(I a) { return vec_ctf(a, 0); }
  static int32_t reduce_add_i(I a) { return (a[0] + a[1]) + (a[2] + a[3]); }
  static I round_i(F x) { return vec_cts(vec_rint(x), 0); }  // xvrspic: the current mode, nearest even
  static B load_b(const void* p) { return vec_xl(0, static_cast<const signed char*>(p)); }
  static void store_i8_block(int8_t* p, const I* v) {  // saturating packs keep element order
    for (int h = 0; h < 2; ++h)
      vec_xst(vec_packs(vec_packs(v[4 * h], v[4 * h + 1]), vec_packs(v[4 * h + 2], v[4 * h + 3])), 16 * h,
              reinterpret_cast<signed char*>(p));
  }
  static I dot_u8s8(I acc, B u, B s) { return vec_msum(s, reinterpret_cast<U8>(u), acc); }  // vmsummbm
  static I dot_s8s8(I acc, B a, B b) {  // b carries a's sign (|b| <= 127: negation is exact)
    const B z = vec_splats(static_cast<signed char>(0));
    return vec_msum(vec_sel(b, vec_sub(z, b), vec_cmplt(a, z)), reinterpret_cast<U8>(vec_abs(a)), acc);
  }
  template <int N>
  static void q4_bytes(const uint8_t* qs, int64_t, B* out) {
    static_assert(N == 1, "one block per step");
    const U8 v = vec_xl(0, qs);
    out[0] = reinterpret_cast<B>(vec_and(v, vec_splats(static_cast<unsigned char>(15))));
    out[1] = reinterpret_cast<B>(vec_sr(v, vec_splats(static_cast<unsigned char>(4))));
  }
  template <int N>
  static void i8_bytes(const uint8_t* p, int64_t, B* out) {
    static_assert(N == 1, "one block per step");
    out[0] = load_b(p), out[1] = load_b(p + 16);
  }
  template <int N>
  static F set1_blocks(float v0, float) {
    static_assert(N == 1, "one block per step");
    return vec_splats(v0);
  }
};
#endif  // ENGINE_VSX

}  // namespace
}  // namespace engine_cpu
