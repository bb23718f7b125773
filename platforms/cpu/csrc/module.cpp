// engine.platforms.cpu._native: pybind11 bindings. No libtorch: callers pass raw addresses
// (tensor.data_ptr()), sizes and element strides; the Python wrappers in
// engine/platforms/cpu/kernels validate tensors and own the memory. Kernels release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gguf_dequant.h"
#include "isa.h"
#include "rms_norm.h"
#include "thread_pool.h"
#include "native_program.h"

namespace py = pybind11;
using namespace engine_cpu;

namespace engine_cpu {
void bind_gguf_linear(py::module_& m);  // bind_gguf_linear.cpp
void bind_attention(py::module_& m);  // bind_attention.cpp
void bind_small_ops(py::module_& m);  // bind_small_ops.cpp
void bind_moe(py::module_& m);  // bind_moe.cpp
void bind_fp16(py::module_& m);  // bind_fp16.cpp
void bind_native_program(py::module_& m);  // bind_native_program.cpp
void bind_shm_all_reduce(py::module_& m);  // bind_comm.cpp
}  // namespace engine_cpu

namespace {

template <typename T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

std::vector<std::string> supported_isa_names() {
  std::vector<std::string> out;
  for (Isa isa : supported_isas()) out.emplace_back(isa_name(isa));
  return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Native CPU kernels (runtime ISA dispatch; raw pointers, no libtorch).";
  init_isa_from_env();
  num_threads();  // validates ENGINE_NUM_THREADS now, so a bad value fails at import with its message
  m.attr("DTYPE_F32") = static_cast<int>(DType::F32);
  m.attr("DTYPE_BF16") = static_cast<int>(DType::BF16);
  m.attr("DTYPE_F16") = static_cast<int>(DType::F16);  // rms_norm, attention, small ops (not the GGUF kernels)

  m.def("num_threads", &num_threads, "Threads the native kernels use (ENGINE_NUM_THREADS, default: all CPUs).");
  m.def("set_num_threads", &set_num_threads, py::arg("n"), "Use n >= 1 threads from now on.");

  m.def("isa", []() { return std::string(isa_name(current_isa())); }, "The ISA variant in use now.");
  m.def("supported_isas", &supported_isa_names,
        "ISA variants this build and CPU can run, best first (avx512, avx2, neon, scalar).");
  m.def("has_dotprod", &cpu_has_dotprod, "AArch64 int8 dot-product instructions (SDOT/UDOT) available.");
  m.def("set_isa", &set_isa, py::arg("name"),
        "Use the named ISA variant from now on (ValueError: unknown name; RuntimeError: CPU lacks it).");

  m.def(
      "gguf_dequant",
      recordable([](int qtype, std::uintptr_t src, int64_t src_stride, int64_t rows, int64_t cols, std::uintptr_t dst,
         int64_t dst_stride, int dtype) {
        gguf_dequant({qtype, ptr<const uint8_t>(src), src_stride, rows, cols, ptr<void>(dst), dst_stride,
                      dtype_from_code(dtype, true)});
      }),
      py::arg("qtype"), py::arg("src"), py::arg("src_stride"), py::arg("rows"), py::arg("cols"), py::arg("dst"),
      py::arg("dst_stride"), py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "GGUF Q4_0/Q4_1/Q8_0 rows (src_stride bytes apart) -> dst rows (dst_stride elements apart).");

  m.def(
      "rms_norm",
      recordable([](std::uintptr_t x, int64_t x_stride, std::uintptr_t w, std::uintptr_t out, int64_t out_stride,
         int64_t rows, int64_t hidden, float eps, int dtype) {
        rms_norm({ptr<const void>(x), x_stride, nullptr, 0, ptr<const void>(w), ptr<void>(out), out_stride,
                  nullptr, 0, rows, hidden, eps, dtype_from_code(dtype, true)});
      }),
      py::arg("x"), py::arg("x_stride"), py::arg("w"), py::arg("out"), py::arg("out_stride"), py::arg("rows"),
      py::arg("hidden"), py::arg("eps"), py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "out = x / sqrt(mean(x^2) + eps) * w per row; strides in elements.");

  m.def(
      "fused_add_rms_norm",
      recordable([](std::uintptr_t x, int64_t x_stride, std::uintptr_t res, int64_t res_stride, std::uintptr_t w,
         std::uintptr_t out, int64_t out_stride, std::uintptr_t sum_out, int64_t sum_stride, int64_t rows,
         int64_t hidden, float eps, int dtype) {
        rms_norm({ptr<const void>(x), x_stride, ptr<const void>(res), res_stride, ptr<const void>(w),
                  ptr<void>(out), out_stride, ptr<void>(sum_out), sum_stride, rows, hidden, eps,
                  dtype_from_code(dtype, true)});
      }),
      py::arg("x"), py::arg("x_stride"), py::arg("residual"), py::arg("residual_stride"), py::arg("w"),
      py::arg("out"), py::arg("out_stride"), py::arg("sum_out"), py::arg("sum_stride"), py::arg("rows"),
      py::arg("hidden"), py::arg("eps"), py::arg("dtype"), py::call_guard<py::gil_scoped_release>(),
      "sum_out = round(x + residual); out = rms_norm(sum_out) * w per row; strides in elements.");

  bind_gguf_linear(m);
  bind_attention(m);
  bind_small_ops(m);
  bind_moe(m);
  bind_fp16(m);
  bind_native_program(m);
  bind_shm_all_reduce(m);
}
