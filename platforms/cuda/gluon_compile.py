"""Ahead-of-time compiles of the Gluon kernels (for a GPU target, on any host, no GPU needed) from a process that may
be running Triton's interpreter.

Why a separate process. ``TRITON_INTERPRET=1`` (the test suite sets it on a machine without a GPU, before Triton is
first imported) is process-wide state that a Gluon compile cannot run under:

* ``@triton.jit`` reads it when a function is *defined*: every ``@triton.jit`` helper of ``triton.language`` is then
  an ``InterpretedFunction``, not a ``JITFunction``. Gluon's ``gl.sum`` / ``gl.max`` / ``gl.cdiv`` .. are Triton's
  ``triton.language.standard`` functions re-wrapped with ``gluon.jit``, and their bodies name those helpers (``sum``
  reduces with ``_sum_combine``), so compiling a kernel that calls them stops at the dependency walk with
  ``RuntimeError('Unsupported function referenced: <triton.runtime.interpreter.InterpretedFunction ...>')``.
  Switching the variable off afterwards does not help: the helpers were made when ``triton.language`` was imported.
* ``constexpr_function`` results stay unwrapped while the knob is on; and an interpreted kernel that calls a
  ``@triton.jit`` device function of another module (``tl.sum``, say) leaves builtins of ``triton.language.core``
  (``load`` ..) patched with the interpreter's versions for the rest of the process (Triton 3.9 restores what a
  launch patched, not what a device call did), so a compile in that process would also depend on which interpreted
  kernels ran before it.

So when the interpreter is on, :func:`compile_outside_interpreter` runs the compile in a fresh Python without
``TRITON_INTERPRET`` and hands back what it built (:class:`CompiledAsm`: ``.asm`` and ``.metadata``). Without the
interpreter (on a GPU machine, or a plain CPU process) the callers compile in-process as before.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

# The child: import the module (with the parent's sys.path), call the function, pickle the compiled kernel's asm and
# metadata to the file.
_CHILD = """
import importlib, pickle, sys
with open(sys.argv[1], "rb") as f:
    path, module, func, kwargs = pickle.load(f)
sys.path[:] = path
from triton import knobs
assert not knobs.runtime.interpret, "the compile's process must run without TRITON_INTERPRET"
kernel = getattr(importlib.import_module(module), func)(**kwargs)
meta = kernel.metadata._asdict() if hasattr(kernel.metadata, "_asdict") else dict(vars(kernel.metadata))
keep = {}
for k, v in meta.items():
    try:
        pickle.dumps(v)
    except Exception:
        continue
    keep[k] = v
with open(sys.argv[2], "wb") as f:
    pickle.dump((dict(kernel.asm), keep), f)
"""


@dataclass
class CompiledAsm:
    """What a compile in another process hands back: Triton's ``CompiledKernel.asm`` (``ptx``, ``cubin``, ``ttgir``
    ..) and its metadata as a dict (the picklable fields). It cannot be launched."""

    asm: dict
    metadata: dict = field(default_factory=dict)


def interpreter_on() -> bool:
    """Whether Triton's interpreter is on in this process (``TRITON_INTERPRET`` or ``triton.knobs``)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def compile_outside_interpreter(module: str, func: str, kwargs: dict, timeout: float = 600) -> CompiledAsm:
    """``module.func(**kwargs)`` (a compile returning Triton's ``CompiledKernel``) run in a fresh Python without
    ``TRITON_INTERPRET``; its ``asm`` and metadata. ``kwargs`` must pickle (torch dtypes, numbers, strings)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="gluon_compile_") as tmp:
        args, out = os.path.join(tmp, "args.pkl"), os.path.join(tmp, "out.pkl")
        with open(args, "wb") as f:
            pickle.dump((list(sys.path), module, func, kwargs), f)
        proc = subprocess.run([sys.executable, "-c", _CHILD, args, out], env=env, cwd=tmp, capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {module}.{func}({kwargs}) in a process without TRITON_INTERPRET failed "
                               f"(exit {proc.returncode}):\n{proc.stderr[-6000:]}")
        with open(out, "rb") as f:
            asm, metadata = pickle.load(f)
    return CompiledAsm(asm, metadata)
