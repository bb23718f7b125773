// pybind11 binding of the shared-memory all-reduce (engine/platforms/cpu/kernels/comm.py owns the segment).
#include <pybind11/pybind11.h>

#include <cstdint>

#include "native_program.h"
#include "shm_all_reduce.h"

namespace py = pybind11;

namespace engine_cpu {

void bind_shm_all_reduce(py::module_& m) {
  m.def(
      "shm_all_reduce",
      recordable([](std::uintptr_t base, int rank, int world, int64_t slot_bytes, int64_t gen, std::uintptr_t x,
                    std::uintptr_t out, int64_t numel, int dtype, double timeout_s) {
        shm_all_reduce(reinterpret_cast<uint8_t*>(base), rank, world, slot_bytes, gen,
                       reinterpret_cast<const uint8_t*>(x), reinterpret_cast<uint8_t*>(out), numel, dtype, timeout_s);
      }),
      py::arg("base"), py::arg("rank"), py::arg("world"), py::arg("slot_bytes"), py::arg("gen"), py::arg("x"),
      py::arg("out"), py::arg("numel"), py::arg("dtype"), py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>(),
      "out = the sum over ranks of each rank's x (contiguous, numel elements; dtype 0 fp32, 1 bf16, 2 fp16), through "
      "the shared segment at base; gen: this call's sequence number, the same on every rank.");
  m.def(
      "shm_exchange",
      recordable([](std::uintptr_t base, int rank, int world, int64_t slot_bytes, int64_t gen, std::uintptr_t x,
                    int64_t nbytes, double timeout_s) {
        shm_exchange(reinterpret_cast<uint8_t*>(base), rank, world, slot_bytes, gen,
                     reinterpret_cast<const uint8_t*>(x), nbytes, timeout_s);
      }),
      py::arg("base"), py::arg("rank"), py::arg("world"), py::arg("slot_bytes"), py::arg("gen"), py::arg("x"),
      py::arg("nbytes"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "copy nbytes at x into this rank's slot of bank gen % 2 and wait until every rank has done so for gen (the "
      "slots then hold every rank's bytes until this rank's next call).");
}

}  // namespace engine_cpu
