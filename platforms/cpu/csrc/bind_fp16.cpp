// pybind11 binding of the fp16 linear (raw addresses and strides in elements, like module.cpp).
#include <pybind11/pybind11.h>

#include <cstdint>

#include "fp16_linear.h"
#include "native_program.h"

namespace py = pybind11;

namespace engine_cpu {

void bind_fp16(py::module_& m) {
  m.def(
      "fp16_linear",
      recordable([](std::uintptr_t x, int64_t x_stride, std::uintptr_t w, int64_t w_stride, std::uintptr_t y,
         int64_t y_stride, int64_t rows, int64_t n, int64_t k, std::uintptr_t bias) {
        fp16_linear({reinterpret_cast<const uint16_t*>(x), x_stride, reinterpret_cast<const uint16_t*>(w), w_stride,
                     reinterpret_cast<uint16_t*>(y), y_stride, rows, n, k, reinterpret_cast<const uint16_t*>(bias)});
      }),
      py::arg("x"), py::arg("x_stride"), py::arg("w"), py::arg("w_stride"), py::arg("y"), py::arg("y_stride"),
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("bias") = 0, py::call_guard<py::gil_scoped_release>(),
      "y[m, n] = x[m, :k] . w[n, :k] (+ bias[n] when its address is not 0), all fp16 (row strides in elements), "
      "fp32 products and sums, y rounded once.");
}

}  // namespace engine_cpu
