// rms_norm: validation and the dispatch to the current ISA's variant (rms_norm_impl.h).
#include "rms_norm.h"

#include <stdexcept>

#include "isa.h"

namespace engine_cpu {

void rms_norm(const RmsNormArgs& a) {
  if (a.hidden <= 0 || a.rows < 0) throw std::invalid_argument("rms_norm: hidden must be > 0 and rows >= 0");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16 && a.dtype != DType::F16)
    throw std::invalid_argument("rms_norm: dtype must be fp32, bf16 or fp16");
  if (a.res != nullptr && a.sum_out == nullptr)
    throw std::invalid_argument("rms_norm: the fused variant needs sum_out");
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return rms_norm_avx512(a);
    case Isa::Avx2: return rms_norm_avx2(a);
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return rms_norm_neon(a);
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return rms_norm_vsx(a);
#endif
#ifdef ENGINE_RVV
    case Isa::Rvv: return rms_norm_rvv(a);
#endif
    default: return rms_norm_scalar(a);
  }
}

}  // namespace engine_cpu
