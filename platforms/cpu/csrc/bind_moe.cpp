// pybind11 bindings of fused_moe and its routing step (raw addresses, sizes, element strides;
// engine/platforms/cpu/kernels/moe.py owns the tensors).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "moe.h"
#include "native_program.h"

namespace py = pybind11;
using namespace engine_cpu;

namespace engine_cpu {

void bind_moe(py::module_& m) {
  m.def(
      "fused_moe",
      recordable([](std::uintptr_t x, int64_t x_stride, std::uintptr_t w13, int64_t w13_expert_stride,
         int64_t w13_row_stride, std::uintptr_t w2, int64_t w2_expert_stride, int64_t w2_row_stride,
         std::uintptr_t logits, int64_t logits_stride, int logits_dtype, std::uintptr_t out, int64_t out_stride,
         int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int top_k, bool renormalize, int dtype) {
        fused_moe({reinterpret_cast<const void*>(x), x_stride, reinterpret_cast<const void*>(w13), w13_expert_stride,
                   w13_row_stride, reinterpret_cast<const void*>(w2), w2_expert_stride, w2_row_stride,
                   reinterpret_cast<const void*>(logits), logits_stride, dtype_from_code(logits_dtype, false),
                   reinterpret_cast<void*>(out), out_stride, tokens, hidden, inter, experts, top_k, renormalize,
                   dtype_from_code(dtype, false)});
      }),
      py::arg("x"), py::arg("x_stride"), py::arg("w13"), py::arg("w13_expert_stride"), py::arg("w13_row_stride"),
      py::arg("w2"), py::arg("w2_expert_stride"), py::arg("w2_row_stride"), py::arg("logits"),
      py::arg("logits_stride"), py::arg("logits_dtype"), py::arg("out"), py::arg("out_stride"), py::arg("tokens"),
      py::arg("hidden"), py::arg("inter"), py::arg("experts"), py::arg("top_k"), py::arg("renormalize"),
      py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "out [T, hidden] = softmax top-k routed SwiGLU experts (core/ops/moe.py); x, w13 [E, 2I, hidden], "
      "w2 [E, hidden, I] and out of dtype, logits [T, E] of logits_dtype; strides in elements.");

  m.def(
      "moe_route",
      recordable([](std::uintptr_t logits, int64_t logits_stride, int logits_dtype, int64_t tokens, int64_t experts,
         int top_k, bool renormalize, std::uintptr_t weights, std::uintptr_t ids) {
        if (top_k < 1 || top_k > experts || logits_stride < experts || tokens < 0)
          throw std::invalid_argument("moe_route: need 1 <= top_k <= experts, logits_stride >= experts, tokens >= 0");
        moe_route(reinterpret_cast<const void*>(logits), logits_stride, dtype_from_code(logits_dtype, false), tokens,
                  experts, top_k, renormalize, reinterpret_cast<float*>(weights), reinterpret_cast<int64_t*>(ids));
      }),
      py::arg("logits"), py::arg("logits_stride"), py::arg("logits_dtype"), py::arg("tokens"), py::arg("experts"),
      py::arg("top_k"), py::arg("renormalize"), py::arg("weights"), py::arg("ids"),
      py::call_guard<py::gil_scoped_release>(),
      "The routing step alone: weights fp32 [T, top_k] and ids int64 [T, top_k], descending weight.");
}

}  // namespace engine_cpu
