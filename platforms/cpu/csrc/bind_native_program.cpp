// _native._record_start / _record_count / _record_stop and _NativeProgram (native_program.h). Underscored: a CPU
// graph capture swaps every public function of the module for a recorder, and these must stay out of it.
#include "native_program.h"

#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace engine_cpu {

std::vector<NativeCall>*& thread_recording() {
  thread_local std::vector<NativeCall>* rec = nullptr;
  return rec;
}

namespace {

struct NativeProgram {
  std::vector<NativeCall> calls;

  void run(size_t begin, size_t end) const {
    if (begin > end || end > calls.size())
      throw std::out_of_range("_NativeProgram.run: calls [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") are not within its " + std::to_string(calls.size()));
    for (size_t i = begin; i < end; ++i) calls[i]();
  }
};

}  // namespace

void bind_native_program(py::module_& m) {
  py::class_<NativeProgram>(m, "_NativeProgram", "Kernel calls recorded by _record_start / _record_stop.")
      .def("run", &NativeProgram::run, py::arg("begin"), py::arg("end"), py::call_guard<py::gil_scoped_release>(),
           "Run recorded calls begin .. end - 1, in order, with the GIL released.")
      .def("__len__", [](const NativeProgram& p) { return p.calls.size(); });
  m.def(
      "_record_start",
      []() {
        if (thread_recording() != nullptr)
          throw std::runtime_error("_record_start: this thread is already recording (call _record_stop first)");
        thread_recording() = new std::vector<NativeCall>();
      },
      "From now until _record_stop, every recordable kernel this thread calls is also recorded.");
  m.def(
      "_record_count", []() -> size_t { return thread_recording() ? thread_recording()->size() : 0; },
      "Calls recorded so far on this thread (0 when not recording).");
  m.def(
      "_record_stop",
      []() {
        std::unique_ptr<std::vector<NativeCall>> rec(thread_recording());
        if (!rec) throw std::runtime_error("_record_stop: this thread is not recording (call _record_start first)");
        thread_recording() = nullptr;
        auto prog = std::make_unique<NativeProgram>();
        prog->calls = std::move(*rec);
        return prog;
      },
      "Stop recording; the recorded calls, as a _NativeProgram.");
}

}  // namespace engine_cpu
