// Recording kernel calls for replay without Python (bound in bind_native_program.cpp). A CPU graph
// (engine/platforms/cpu/graph.py) captures a decode step by running it; every binding wrapped in recordable() also
// appends its call, arguments bound, to the capturing thread's recording. _NativeProgram.run then replays a range
// of those calls in one C++ loop with the GIL released once, instead of one Python call (argument conversion, GIL
// release and reacquire) per kernel.
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace engine_cpu {

using NativeCall = std::function<void()>;

// The calls recorded on this thread since record_start() (nullptr when not recording).
std::vector<NativeCall>*& thread_recording();

// A binding lambda of scalar arguments returning void, made to also record its call while this thread records.
// (A call that throws is not recorded: the capture fails with it.)
template <class F, class... A>
auto recordable_impl(F f, void (F::*)(A...) const) {
  return [f](A... a) {
    f(a...);
    if (std::vector<NativeCall>* rec = thread_recording()) rec->emplace_back([f, a...] { f(a...); });
  };
}

template <class F>
auto recordable(F f) {
  return recordable_impl(std::move(f), &F::operator());
}

}  // namespace engine_cpu
