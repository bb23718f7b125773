// pybind11 binding of the fused GGUF linear (raw addresses and strides, like module.cpp).
#include <pybind11/pybind11.h>

#include <cstdint>

#include "gguf_linear.h"
#include "gguf_packed.h"
#include "gguf_q8act.h"
#include "native_program.h"

namespace py = pybind11;

namespace engine_cpu {

namespace {

// The GGUF linears take the same raw-address arguments (GgufLinearArgs); their drivers validate them, the dtype
// code included. The packed ones (Fn with a second argument) also take the address of the packed copy.
template <void (*Fn)(const GgufLinearArgs&)>
void call_linear(const GgufLinearArgs& a, std::uintptr_t) { Fn(a); }

template <void (*Fn)(const GgufLinearArgs&, const uint8_t*)>
void call_packed(const GgufLinearArgs& a, std::uintptr_t packed) { Fn(a, reinterpret_cast<const uint8_t*>(packed)); }

template <void (*Call)(const GgufLinearArgs&, std::uintptr_t), bool kPacked>
void def_gguf_linear(py::module_& m, const char* name, const char* doc) {
  auto args = [](int qtype, std::uintptr_t x, int64_t x_stride, int64_t rows, int64_t k, std::uintptr_t w,
                 int64_t w_stride, int64_t n, std::uintptr_t y, int64_t y_stride, int dtype) {
    return GgufLinearArgs{qtype, reinterpret_cast<const void*>(x), x_stride, rows, k,
                          reinterpret_cast<const uint8_t*>(w), w_stride, n, reinterpret_cast<void*>(y), y_stride,
                          static_cast<DType>(dtype)};
  };
  if constexpr (kPacked) {
    m.def(
        name,
        recordable([args](int qtype, std::uintptr_t x, int64_t x_stride, int64_t rows, int64_t k, std::uintptr_t w,
                          int64_t w_stride, int64_t n, std::uintptr_t y, int64_t y_stride, int dtype,
                          std::uintptr_t packed) {
          Call(args(qtype, x, x_stride, rows, k, w, w_stride, n, y, y_stride, dtype), packed);
        }),
        py::arg("qtype"), py::arg("x"), py::arg("x_stride"), py::arg("m"), py::arg("k"), py::arg("w"),
        py::arg("w_stride"), py::arg("n"), py::arg("y"), py::arg("y_stride"), py::arg("dtype"), py::arg("packed"),
        py::call_guard<py::gil_scoped_release>(), doc);
  } else {
    m.def(
        name,
        recordable([args](int qtype, std::uintptr_t x, int64_t x_stride, int64_t rows, int64_t k, std::uintptr_t w,
                          int64_t w_stride, int64_t n, std::uintptr_t y, int64_t y_stride, int dtype) {
          Call(args(qtype, x, x_stride, rows, k, w, w_stride, n, y, y_stride, dtype), 0);
        }),
        py::arg("qtype"), py::arg("x"), py::arg("x_stride"), py::arg("m"), py::arg("k"), py::arg("w"),
        py::arg("w_stride"), py::arg("n"), py::arg("y"), py::arg("y_stride"), py::arg("dtype"),
        py::call_guard<py::gil_scoped_release>(), doc);
  }
}

}  // namespace

void bind_gguf_linear(py::module_& m) {
  def_gguf_linear<call_linear<gguf_linear>, false>(
      m, "gguf_linear",
      "y[m, n] = x[m, :k] . dequant(w)[n, :k]: x and y of dtype (0 fp32, 1 bf16; strides in elements), w GGUF "
      "Q4_0/Q4_1/Q8_0 rows w_stride bytes apart; fp32 math, never materializes the weight.");
  def_gguf_linear<call_linear<gguf_linear_q8act>, false>(
      m, "gguf_linear_q8act",
      "As gguf_linear, with x rounded to Q8 blocks (engine.core.ops.gguf_q8act.quantize_q8_blocks) and integer "
      "block dots.");
  m.def("gguf_q8act_variant", &gguf_q8act_variant,
        "The kernel variant gguf_linear_q8act runs on now (avx512_vnni, avx2, neon_dotprod, neon, scalar).");

  // The row-interleaved copy of a GGUF weight (gguf_packed.h) and the Q8-activation linear reading it.
  m.def("gguf_packed_bytes", &gguf_packed_bytes, py::arg("qtype"), py::arg("n"), py::arg("k"),
        "Bytes of the packed copy of n GGUF rows of k columns (rows padded to groups of 16).");
  m.def(
      "gguf_pack",
      [](int qtype, std::uintptr_t w, int64_t w_stride, int64_t n, int64_t k, std::uintptr_t out) {
        gguf_pack(qtype, reinterpret_cast<const uint8_t*>(w), w_stride, n, k, reinterpret_cast<uint8_t*>(out));
        return gguf_packed_bytes(qtype, n, k);  // a value, so a CPU graph capture does not record it as work
      },
      py::arg("qtype"), py::arg("w"), py::arg("w_stride"), py::arg("n"), py::arg("k"), py::arg("out"),
      py::call_guard<py::gil_scoped_release>(),
      "Pack n GGUF rows (w_stride bytes apart) into out (gguf_packed_bytes bytes); returns the bytes written.");
  m.def(
      "gguf_unpack",
      [](int qtype, std::uintptr_t packed, int64_t n, int64_t k, std::uintptr_t w, int64_t w_stride) {
        gguf_unpack(qtype, reinterpret_cast<const uint8_t*>(packed), n, k, reinterpret_cast<uint8_t*>(w), w_stride);
      },
      py::arg("qtype"), py::arg("packed"), py::arg("n"), py::arg("k"), py::arg("w"), py::arg("w_stride"),
      py::call_guard<py::gil_scoped_release>(), "The inverse of gguf_pack: n GGUF rows into w.");
  m.def(
      "gguf_advise_huge_pages",
      [](std::uintptr_t p, int64_t bytes) { return gguf_advise_huge_pages(reinterpret_cast<void*>(p), bytes); },
      py::arg("p"), py::arg("bytes"),
      "Ask for huge pages on the 2 MB pages inside [p, p + bytes) (Linux; before the memory is written); returns "
      "the bytes advised.");
  m.def("gguf_packed_variant", &gguf_packed_variant,
        "The packed kernel variant for the current ISA (avx512_vnni, avx2, scalar), or '' where there is none.");
  def_gguf_linear<call_packed<gguf_linear_q8act_packed>, true>(
      m, "gguf_linear_q8act_packed",
      "gguf_linear_q8act reading the weight from packed (gguf_pack of w); on the raw rows w where "
      "gguf_packed_variant() is ''.");
  m.def("gguf_packed_f32_variant", &gguf_packed_f32_variant,
        "The packed fp32-activation kernel variant for the current ISA (avx512, avx2, scalar), or '' where there is "
        "none (exactly where gguf_packed_variant() is '').");
  def_gguf_linear<call_packed<gguf_linear_packed>, true>(
      m, "gguf_linear_packed",
      "gguf_linear (fp32 x, never quantized) reading the weight from packed (gguf_pack of w); on the raw rows w "
      "where gguf_packed_f32_variant() is ''.");
}

}  // namespace engine_cpu
