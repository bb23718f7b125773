// Validation and the per-ISA dispatch; the kernels are gguf_dequant_impl.h instantiated per ISA
// (gguf_dequant_{scalar,avx2,avx512,neon,vsx}.cpp). RVV runs the portable path.
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

int gguf_row_bytes(int qtype, int64_t k) {
  if (gguf_kquant_bytes(qtype) != 0) return k > 0 && k % 256 == 0 ? static_cast<int>(k / 256) * gguf_kquant_bytes(qtype) : 0;
  return k > 0 && k % 32 == 0 ? static_cast<int>(k / 32) * gguf_block_bytes(qtype) : 0;
}

void gguf_dequant(const DequantArgs& a) {
  if (gguf_block_bytes(a.qtype) == 0 && gguf_kquant_bytes(a.qtype) == 0)
    throw std::invalid_argument("gguf_dequant: unsupported qtype " + std::to_string(a.qtype) +
                                "; supported: Q4_0=2, Q4_1=3, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14");
  if (a.rows < 0 || gguf_row_bytes(a.qtype, a.cols) == 0)
    throw std::invalid_argument("gguf_dequant: cols must be a positive multiple of the block (32; K-quants 256) "
                                "and rows >= 0");
  if (a.dtype != DType::F32 && a.dtype != DType::BF16)
    throw std::invalid_argument("gguf_dequant: output dtype must be fp32 or bf16");
  if (gguf_kquant_bytes(a.qtype) != 0) return gguf_kquant_dequant(a);
  switch (current_isa()) {
#ifdef ENGINE_X86
    case Isa::Avx512: return gguf_dequant_avx512(a);
    case Isa::Avx2: return gguf_dequant_avx2(a);
#endif
#ifdef ENGINE_ARM64
    case Isa::Neon: return gguf_dequant_neon(a);
#endif
#ifdef ENGINE_VSX
    case Isa::Vsx: return gguf_dequant_vsx(a);
#endif
    default: return gguf_dequant_scalar(a);
  }
}

}  // namespace engine_cpu
