// pybind11 binding of the fused GGUF linear (raw addresses and strides, like module.cpp).
#include <pybind11/pybind11.h>

#include <cstdint>

#include "gguf_linear.h"
#include "gguf_q8act.h"

namespace py = pybind11;

namespace engine_cpu {

namespace {

// Both GGUF linears take the same raw-address arguments (GgufLinearArgs); their drivers validate them,
// the dtype code included.
template <void (*Fn)(const GgufLinearArgs&)>
void def_gguf_linear(py::module_& m, const char* name, const char* doc) {
  m.def(
      name,
      [](int qtype, std::uintptr_t x, int64_t x_stride, int64_t rows, int64_t k, std::uintptr_t w, int64_t w_stride,
         int64_t n, std::uintptr_t y, int64_t y_stride, int dtype) {
        Fn({qtype, reinterpret_cast<const void*>(x), x_stride, rows, k, reinterpret_cast<const uint8_t*>(w),
            w_stride, n, reinterpret_cast<void*>(y), y_stride, static_cast<DType>(dtype)});
      },
      py::arg("qtype"), py::arg("x"), py::arg("x_stride"), py::arg("m"), py::arg("k"), py::arg("w"),
      py::arg("w_stride"), py::arg("n"), py::arg("y"), py::arg("y_stride"), py::arg("dtype"),
      py::call_guard<py::gil_scoped_release>(), doc);
}

}  // namespace

void bind_gguf_linear(py::module_& m) {
  def_gguf_linear<gguf_linear>(
      m, "gguf_linear",
      "y[m, n] = x[m, :k] . dequant(w)[n, :k]: x and y of dtype (0 fp32, 1 bf16; strides in elements), w GGUF "
      "Q4_0/Q4_1/Q8_0 rows w_stride bytes apart; fp32 math, never materializes the weight.");
  def_gguf_linear<gguf_linear_q8act>(
      m, "gguf_linear_q8act",
      "As gguf_linear, with x rounded to Q8 blocks (engine.core.ops.gguf_q8act.quantize_q8_blocks) and integer "
      "block dots.");
  m.def("gguf_q8act_variant", &gguf_q8act_variant,
        "The kernel variant gguf_linear_q8act runs on now (avx512_vnni, avx2, neon_dotprod, neon, scalar).");
}

}  // namespace engine_cpu
