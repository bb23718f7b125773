// pybind11 bindings of the paged-attention kernels and write_kv_cache (raw addresses, sizes and
// element strides; engine/platforms/cpu/kernels/attention.py owns the tensors). Shapes that the
// dispatcher's supports() cache cannot see (the first dimension of every tensor) are passed and
// checked in C++: a mismatch raises ValueError instead of reading out of bounds.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "paged_attention.h"
#include "native_program.h"

namespace py = pybind11;
using namespace engine_cpu;

namespace {

template <typename T>
T* as(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

}  // namespace

namespace engine_cpu {

void bind_attention(py::module_& m) {
  m.def(
      "paged_attention",
      recordable([](std::uintptr_t q, int64_t tokens, int64_t hq, int64_t head_dim, std::uintptr_t k_cache,
         std::uintptr_t v_cache, int64_t num_blocks, int64_t v_num_blocks, int64_t block_size, int64_t hk,
         std::uintptr_t block_tables, int64_t bt_rows, int64_t max_blocks, int64_t bt_stride0, int64_t bt_stride1,
         std::uintptr_t seq_lens, int64_t num_seqs, std::uintptr_t cu_seqlens_q, int64_t cu_len, std::uintptr_t out,
         float scale, int dtype) {
        PagedAttnArgs a;
        a.q = as<const void>(q);
        a.k_cache = as<const void>(k_cache);
        a.v_cache = as<const void>(v_cache);
        a.block_tables = as<const int32_t>(block_tables);
        a.bt_rows = bt_rows;
        a.max_blocks = max_blocks;
        a.bt_stride0 = bt_stride0;
        a.bt_stride1 = bt_stride1;
        a.seq_lens = as<const int32_t>(seq_lens);
        a.num_seqs = num_seqs;
        a.cu_seqlens_q = as<const int32_t>(cu_seqlens_q);
        a.cu_len = cu_len;
        a.out = as<void>(out);
        a.num_tokens = tokens;
        a.hq = hq;
        a.hk = hk;
        a.head_dim = head_dim;
        a.num_blocks = num_blocks;
        a.v_num_blocks = v_num_blocks;
        a.block_size = block_size;
        a.scale = scale;
        a.dtype = dtype_from_code(dtype, true);
        paged_attention(a);
      }),
      py::arg("q"), py::arg("tokens"), py::arg("hq"), py::arg("head_dim"), py::arg("k_cache"), py::arg("v_cache"),
      py::arg("num_blocks"), py::arg("v_num_blocks"), py::arg("block_size"), py::arg("hk"), py::arg("block_tables"),
      py::arg("bt_rows"), py::arg("max_blocks"), py::arg("bt_stride0"), py::arg("bt_stride1"), py::arg("seq_lens"),
      py::arg("num_seqs"), py::arg("cu_seqlens_q"), py::arg("cu_len"), py::arg("out"), py::arg("scale"),
      py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "Paged attention, fp32 math. cu_seqlens_q == 0: decode (query b is row b, at position seq_lens[b]-1); "
      "else causal prefill of the last q_len positions of each sequence. Strides in elements.");

  m.def(
      "write_kv_cache",
      recordable([](std::uintptr_t key, int64_t tokens, std::uintptr_t value, int64_t value_tokens,
         std::uintptr_t k_cache,
         std::uintptr_t v_cache, int64_t num_slots, int64_t v_num_slots, std::uintptr_t slots, int64_t slot_tokens,
         int64_t row_bytes) {
        write_kv_cache({as<const void>(key), as<const void>(value), as<void>(k_cache), as<void>(v_cache),
                        as<const int64_t>(slots), tokens, value_tokens, slot_tokens, row_bytes, num_slots,
                        v_num_slots});
      }),
      py::arg("key"), py::arg("tokens"), py::arg("value"), py::arg("value_tokens"), py::arg("k_cache"),
      py::arg("v_cache"), py::arg("num_slots"), py::arg("v_num_slots"), py::arg("slots"), py::arg("slot_tokens"),
      py::arg("row_bytes"), py::call_guard<py::gil_scoped_release>(),
      "cache row slots[t] = token row t for slots[t] >= 0 (rows of row_bytes, contiguous).");
}

}  // namespace engine_cpu
