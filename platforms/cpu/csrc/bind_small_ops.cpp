// pybind11 bindings of silu_and_mul, rotary_embedding and rotary_write_kv (raw addresses, sizes, element strides;
// engine/platforms/cpu/kernels/small_ops.py owns the tensors).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "activation.h"
#include "rotary.h"
#include "native_program.h"

namespace py = pybind11;
using namespace engine_cpu;

namespace engine_cpu {

void bind_small_ops(py::module_& m) {
  m.def(
      "silu_and_mul",
      recordable([](std::uintptr_t x, int64_t x_stride, std::uintptr_t out, int64_t out_stride, int64_t rows, int64_t d,
         int dtype) {
        silu_and_mul({reinterpret_cast<const void*>(x), x_stride, reinterpret_cast<void*>(out), out_stride, rows, d,
                      dtype_from_code(dtype, true)});
      }),
      py::arg("x"), py::arg("x_stride"), py::arg("out"), py::arg("out_stride"), py::arg("rows"), py::arg("d"),
      py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "out[r, :d] = silu(x[r, :d]) * x[r, d:2d] per row; strides in elements.");

  m.def(
      "rotary_embedding",
      recordable([](std::uintptr_t positions, int64_t tokens, std::uintptr_t q, int64_t q_stride, int64_t q_tokens,
         int64_t q_heads, std::uintptr_t q_out, std::uintptr_t k, int64_t k_stride, int64_t k_tokens, int64_t k_heads,
         std::uintptr_t k_out, std::uintptr_t cos_sin, int64_t max_pos, int64_t rot_dim, int64_t head_dim, bool neox,
         int dtype) {
        RotaryArgs a{reinterpret_cast<const int64_t*>(positions), tokens, reinterpret_cast<const void*>(q),
                     q_stride, q_tokens, q_heads, reinterpret_cast<void*>(q_out), reinterpret_cast<const void*>(k),
                     k_stride, k_tokens, k_heads, reinterpret_cast<void*>(k_out),
                     reinterpret_cast<const float*>(cos_sin), max_pos, rot_dim, head_dim, neox, dtype_from_code(dtype, true)};
        rotary_embedding(a);
      }),
      py::arg("positions"), py::arg("tokens"), py::arg("q"), py::arg("q_stride"), py::arg("q_tokens"),
      py::arg("q_heads"), py::arg("q_out"), py::arg("k"), py::arg("k_stride"), py::arg("k_tokens"), py::arg("k_heads"),
      py::arg("k_out"), py::arg("cos_sin"), py::arg("max_pos"), py::arg("rot_dim"), py::arg("head_dim"),
      py::arg("neox"), py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "RoPE of q and k rows (token rows q_stride / k_stride elements apart) into contiguous q_out, k_out; "
      "cos_sin fp32 [max_pos, rot_dim].");

  m.def(
      "rotary_write_kv",
      recordable([](std::uintptr_t positions, int64_t tokens, std::uintptr_t q, int64_t q_stride, int64_t q_tokens,
         int64_t q_heads, std::uintptr_t q_out, std::uintptr_t k, int64_t k_stride, int64_t k_tokens, int64_t k_heads,
         std::uintptr_t v, int64_t v_stride, int64_t v_tokens, std::uintptr_t k_cache, std::uintptr_t v_cache,
         int64_t num_slots, int64_t v_num_slots, std::uintptr_t slots, int64_t slot_tokens, std::uintptr_t cos_sin,
         int64_t max_pos, int64_t rot_dim, int64_t head_dim, bool neox, int dtype) {
        RotaryArgs a{reinterpret_cast<const int64_t*>(positions), tokens, reinterpret_cast<const void*>(q),
                     q_stride, q_tokens, q_heads, reinterpret_cast<void*>(q_out), reinterpret_cast<const void*>(k),
                     k_stride, k_tokens, k_heads, nullptr, reinterpret_cast<const float*>(cos_sin), max_pos, rot_dim,
                     head_dim, neox, dtype_from_code(dtype, true)};
        a.slots = reinterpret_cast<const int64_t*>(slots);
        a.slot_tokens = slot_tokens;
        a.v = reinterpret_cast<const void*>(v);
        a.v_stride = v_stride;
        a.v_tokens = v_tokens;
        a.k_cache = reinterpret_cast<void*>(k_cache);
        a.v_cache = reinterpret_cast<void*>(v_cache);
        a.num_slots = num_slots;
        a.v_num_slots = v_num_slots;
        rotary_embedding(a);
      }),
      py::arg("positions"), py::arg("tokens"), py::arg("q"), py::arg("q_stride"), py::arg("q_tokens"),
      py::arg("q_heads"), py::arg("q_out"), py::arg("k"), py::arg("k_stride"), py::arg("k_tokens"), py::arg("k_heads"),
      py::arg("v"), py::arg("v_stride"), py::arg("v_tokens"), py::arg("k_cache"), py::arg("v_cache"),
      py::arg("num_slots"), py::arg("v_num_slots"), py::arg("slots"), py::arg("slot_tokens"), py::arg("cos_sin"),
      py::arg("max_pos"), py::arg("rot_dim"), py::arg("head_dim"), py::arg("neox"), py::arg("dtype"),
      py::call_guard<py::gil_scoped_release>(),
      "rotary_embedding of q into contiguous q_out, and of k straight into k_cache row slots[t], with v's row into "
      "v_cache row slots[t] (slots < 0 skipped; every slot checked before any write). Strides in elements.");
}

}  // namespace engine_cpu
