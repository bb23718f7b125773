"""CPU "graphs": a decode step recorded once as a flat list of calls, then replayed without the Python between them.

A single-stream decode step on the CPU makes ~300 native kernel calls, and the Python around each (the model's
layer code, dispatch, the wrapper's shape arithmetic and output allocation) cost as much as a quarter to a third of
the step (issue 11). ``capture(fn)`` runs ``fn()`` once, for real, while recording:

- every call of an ``engine.platforms.cpu._native`` function (with its arguments: addresses, sizes, scalars), by
  swapping the module's functions for recording ones for the duration; the kernel wrappers look them up on the
  module at call time, so they pass through the recorders;
- every torch function ``fn`` calls (a ``TorchFunctionMode``): allocations and views need nothing on replay but
  their outputs are kept alive, because recorded native calls hold their addresses; anything else (an index, a
  copy, a plain-torch reference of an op with no native kernel) is re-run on replay and its result copied into
  the tensor the capture produced, so later calls find it where they recorded it.

``replay()`` then re-runs the recorded calls in order on the same memory. The caller owns the inputs' memory (the
decode graph's static buffers): write new inputs there, replay, read the outputs ``fn`` returned. Kernel calls the
module also recorded natively (its ``recordable`` bindings, native_program.h) replay as runs of consecutive calls in
one C++ loop each, with the GIL released once, instead of a Python call per kernel (argument conversion and GIL
hand-over, ~0.3-0.5 us each when warm): the ~270-call single-stream decode step of SmolLM2 replays ~5% faster (2-core
Zen 5). A call through anything but the module's own function (a profiler's timing wrapper, say) replays through
that wrapper, in Python.

What a capture cannot replay, it refuses (RuntimeError, so the engine stays eager): a read of tensor values on the
host (``.item()``, ``.tolist()``, a tensor in an ``if``), whose answer the replay would not recompute, and ops whose
output shape depends on the data. Control flow on shapes is fine: every replay has the capture's shapes.
"""

from __future__ import annotations

import functools
import threading
import types

import torch
from torch.overrides import TorchFunctionMode

from engine.platforms.cpu import _native

# Torch functions whose outputs need no recomputation: fresh memory the recorded calls then fill, views of
# recorded memory, and metadata. Their tensor outputs are kept alive all the same.
_NO_REPLAY = frozenset({
    "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
    "view", "view_as", "split", "split_with_sizes", "chunk", "unbind", "narrow", "select", "squeeze", "unsqueeze",
    "transpose", "t", "permute", "expand", "as_strided", "unflatten", "flatten", "reshape", "contiguous",
    "data_ptr", "is_contiguous", "stride", "size", "dim", "numel", "element_size", "storage_offset",
    "__get__", "__len__", "__hash__",
})
# Functions that hand tensor values to the host or give data-dependent shapes: a replay would not redo them.
_REFUSE = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__", "__format__",
    "__repr__", "__str__", "nonzero", "nonzero_static", "masked_select", "unique", "unique_consecutive", "bincount",
    "argwhere", "where_single", "equal", "allclose", "any", "all",
})
_CONVERSIONS = frozenset({"float", "to", "type", "type_as", "double", "half", "bfloat16", "cpu"})


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for t in x if isinstance(t, torch.Tensor)]
    return []


def _name(func) -> str:
    return getattr(func, "__name__", "") or str(func)


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list = []  # zero-argument callables, in the order of the capture
        self.keep: list[torch.Tensor] = []  # every tensor the capture made: recorded addresses point into them
        self.fresh: dict[int, int] = {}  # storages the capture allocated (not views of its inputs): address -> bytes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in _REFUSE or (name == "__getitem__" and _bool_index(args)):
            raise RuntimeError(f"a CPU graph cannot capture {name}: it reads tensor values on the host or its output "
                               "shape depends on them, which a replay would not redo")
        out = func(*args, **kwargs)
        outs = _tensors(out)
        self.keep.extend(outs)
        if outs:
            seen = {t.untyped_storage().data_ptr() for t in _tensors(args)}
            for t in outs:
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    self.fresh[storage.data_ptr()] = storage.nbytes()
        if name in _NO_REPLAY and not _copied(name, args, outs):
            return out
        if name == "__getitem__" and not _tensor_index(args):  # basic indexing: a view
            return out
        if name in _CONVERSIONS and out is (args[0] if args else None):  # converting to what it already is
            return out
        self.calls.append(_rerun(func, args, kwargs, outs))
        return out


def _copied(name: str, args, outs: list[torch.Tensor]) -> bool:
    """True when a reshape/contiguous made new memory (a copy the replay must redo); views never do."""
    if name not in ("reshape", "contiguous", "flatten") or not args or not isinstance(args[0], torch.Tensor):
        return False
    return any(t.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr() for t in outs)


def _index_parts(args):
    idx = args[1] if len(args) > 1 else ()
    return idx if isinstance(idx, tuple) else (idx,)


def _tensor_index(args) -> bool:
    return any(isinstance(i, (torch.Tensor, list)) for i in _index_parts(args))


def _bool_index(args) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in _index_parts(args))


def _rerun(func, args, kwargs, outs: list[torch.Tensor]):
    """A call that re-runs ``func`` and puts each new result where the capture's result lives."""
    def call():
        new = _tensors(func(*args, **kwargs))
        for dst, src in zip(outs, new, strict=True):
            if dst.data_ptr() != src.data_ptr():  # in-place ops and no-op conversions return the same memory
                dst.copy_(src)
    return call


class _Native(int):
    """A recorded call that the native recording holds too: its index there."""


def _recording(name: str, fn, calls: list, thread: int):
    """``fn`` recorded when the capturing thread calls it (another thread's kernels are not part of the capture).
    Kernels return None and are recorded (natively where the module recorded the call itself); queries (``isa()``,
    ``num_threads()``) return a value and do no work; a setting changed mid-capture (``set_num_threads``) is
    refused."""
    native = isinstance(fn, types.BuiltinFunctionType)  # the module's own binding, not a Python wrapper of it

    def rec(*args):
        if threading.get_ident() != thread:
            return fn(*args)
        if name.startswith("set_"):
            raise RuntimeError(f"a CPU graph cannot capture _native.{name}: it changes a setting, not memory")
        before = _native._record_count()
        out = fn(*args)
        if out is None:
            recorded = native and _native._record_count() == before + 1
            calls.append(_Native(before) if recorded else functools.partial(fn, *args))
        return out
    return rec


def _replay_calls(calls: list, program) -> list:
    """The recorded calls with each run of consecutive natively recorded ones made one ``program.run``."""
    out: list = []
    start = end = None
    for call in [*calls, None]:
        if isinstance(call, _Native) and start is not None and call == end:
            end += 1
            continue
        if start is not None:
            out.append(functools.partial(program.run, start, end))
            start = end = None
        if isinstance(call, _Native):
            start, end = int(call), int(call) + 1
        elif call is not None:
            out.append(call)
    return out


_lock = threading.Lock()


def capture(fn):
    """Run ``fn()`` (its results are real) and return ``(replay, outputs)``: ``replay()`` redoes its work on the
    same memory. Raises RuntimeError (after restoring everything) when ``fn`` does what a replay cannot redo."""
    with _lock:  # one capture at a time: the module's functions are swapped process-wide
        rec = _Recorder()
        names = [n for n in dir(_native) if not n.startswith("_") and callable(getattr(_native, n))]
        originals = {n: getattr(_native, n) for n in names}
        thread = threading.get_ident()
        _native._record_start()
        try:
            for n, f in originals.items():
                setattr(_native, n, _recording(n, f, rec.calls, thread))
            with rec:
                out = fn()
        finally:
            for n, f in originals.items():
                setattr(_native, n, f)
            program = _native._record_stop()
    calls, keep = tuple(_replay_calls(rec.calls, program)), rec.keep

    def replay() -> None:
        for call in calls:
            call()

    replay.keep = keep  # the memory the recorded calls address lives as long as the replay
    replay.fresh_bytes = sum(rec.fresh.values())  # of it, what the capture allocated (views of weights excluded)
    replay.num_calls = len(rec.calls)
    replay.num_native = sum(isinstance(c, _Native) for c in rec.calls)  # of them, those run by the native loop
    return replay, out
