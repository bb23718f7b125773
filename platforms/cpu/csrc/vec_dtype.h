// Storage-typed vector loads and stores for the streaming kernels (rms_norm, rotary, activation):
// element i of an fp32, bf16 or fp16 array as fp32 lanes. kFull: a whole vector (V::lanes() values);
// otherwise the first n lanes (loads put 0 in the others, stores leave the memory past n alone).
// Include from a *_impl.h after ENGINE_VEC_FN is defined (the backend's target attribute).
#pragma once

#include <cstdint>

#include "convert.h"
#include "vec.h"

#ifndef ENGINE_VEC_FN
#error "define ENGINE_VEC_FN before including vec_dtype.h"
#endif

namespace engine_cpu {
namespace {

template <class V, DType D, bool kFull>
ENGINE_VEC_FN inline typename V::F vld(const void* p, int64_t i, size_t n) {
  if constexpr (D == DType::F32) {
    const float* q = static_cast<const float*>(p) + i;
    if constexpr (kFull) return V::load(q);
    else return V::load_n(q, n);
  } else {
    const uint16_t* q = static_cast<const uint16_t*>(p) + i;
    if constexpr (D == DType::BF16 && kFull) return V::load_bf16(q);
    else if constexpr (D == DType::BF16) return V::load_bf16_n(q, n);
    else if constexpr (kFull) return V::load_fp16(q);
    else return V::load_fp16_n(q, n);
  }
}

template <class V, DType D, bool kFull>
ENGINE_VEC_FN inline void vst(void* p, int64_t i, typename V::F v, size_t n) {
  if constexpr (D == DType::F32) {
    float* q = static_cast<float*>(p) + i;
    if constexpr (kFull) V::store(q, v);
    else V::store_n(q, v, n);
  } else {
    uint16_t* q = static_cast<uint16_t*>(p) + i;
    if constexpr (D == DType::BF16 && kFull) V::store_bf16(q, v);
    else if constexpr (D == DType::BF16) V::store_bf16_n(q, v, n);
    else if constexpr (kFull) V::store_fp16(q, v);
    else V::store_fp16_n(q, v, n);
  }
}

constexpr int64_t dtype_size(DType d) { return d == DType::F32 ? 4 : 2; }

}  // namespace
}  // namespace engine_cpu
