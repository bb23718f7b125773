"""Kernel contracts and dispatch.

An :class:`OpDef` declares one op: its torch.library schema, a plain-torch reference
implementation (the specification), a fake (meta) implementation, an input generator,
conformance cases and a tolerance per dtype. Platforms add implementations to a
:class:`KernelRegistry`; calling the op dispatches to the best implementation whose
``supports(*args)`` accepts the arguments, else to the reference.

``supports`` contract: it returns ``True`` when the implementation handles these arguments,
otherwise ``False`` or a short string saying why not. It may look at dtypes, devices, shapes,
contiguity and non-float scalar arguments; the choice is cached on exactly those, so it must not
depend on anything else (not on values, not on strides beyond contiguity).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

_LIB = torch.library.Library("engine", "DEF")
log = logging.getLogger("engine")


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class Case:
    """One conformance input configuration: shape parameters handed to the op's input generator.

    ``engine_shape``: the engine sends calls of this shape (real model sizes and layouts), so a platform that
    registers kernels for the op must serve it with one of them (the conformance kit fails a platform whose kernels
    all decline it). Odd sizes no model has are checked when a kernel accepts them, but may be declined."""

    name: str
    params: dict = field(default_factory=dict)
    dtypes: tuple | None = None  # restricts the op's dtypes for this case
    engine_shape: bool = False
    # Platform facts the case is an engine shape on, e.g. {"fp8": "e4m3fnuz"}: the ROCm flavour is sent only
    # where the platform's fp8_dtype() is it (elsewhere the case is checked where a kernel accepts it).
    needs: dict = field(default_factory=dict)


@dataclass
class OpDef:
    """One op, declared once. See the module docstring for the contract."""

    name: str
    schema: str
    reference: Callable
    fake: Callable
    make_inputs: Callable  # (params: dict, dtype, device, generator) -> tuple of call arguments
    cases: Sequence[Case]
    tolerances: dict  # dtype -> Tolerance
    mutates: tuple[int, ...] = ()  # indices of arguments written in place; these are the outputs compared
    doc: str = ""
    # The outputs are the correctly rounded fp32 result (elementwise ops): in bf16/fp16 the kit then also
    # requires almost every element to equal the reference's bit for bit, which truncating kernels fail.
    rounded_outputs: bool = False
    # draw(rng: random.Random) -> list[Case]: the shapes the conformance kit draws afresh each run (real model
    # sizes, special rows); ``cases`` are the fixed ones every run also checks.
    draw: Callable | None = None
    # The op quantizes an intermediate (activations to FP8 / int8): an implementation that sums in another order
    # may round a value to the neighbouring quantization step, which moves its output row. The kit then lets rows
    # exceed the row bound derived from the reference, within the declared tolerance, while the whole output keeps
    # to its bound (engine.core.testing.oracle).
    quantizes_intermediates: bool = False
    # error_scale(*args) -> float: the magnitude of the terms each output sums, where an output can be far smaller
    # than them (attention averages values of either sign): the kit's error bound allows roundings of this much.
    error_scale: Callable | None = None
    # The relative error a right kernel may add beyond its output's rounding, where the hardware's arithmetic is
    # coarser than the reference's fp32 (FP8 tensor cores accumulate in fewer bits than fp32).
    accumulation_roundoff: float = 0.0
    # A collective (all_reduce, all_gather, broadcast): across_ranks(inputs, rank) -> what rank ``rank`` must return,
    # given the call arguments of every rank (a list indexed by rank). Its kernels need a process group of several
    # ranks, so the kit serves them in its multi-process check (engine.core.testing.distributed), not one process.
    across_ranks: Callable | None = None

    def __post_init__(self):
        _LIB.define(self.name + self.schema)
        _LIB.impl(self.name, self._dispatch, "CompositeExplicitAutograd")
        torch.library.register_fake(f"engine::{self.name}", self.fake, lib=_LIB)
        self.reference_impl = Impl(self.name, "reference", self.reference, platform="core", priority=-(10**9))
        OPS[self.name] = self

    @property
    def collective(self) -> bool:
        return self.across_ranks is not None

    @property
    def dtypes(self) -> tuple:
        return tuple(self.tolerances)

    @property
    def torch_op(self):
        """The registered torch custom op (``torch.ops.engine.<name>``), traceable by torch.compile."""
        return getattr(torch.ops.engine, self.name)

    def _dispatch(self, *args):
        return active_registry().select(self, args).fn(*args)

    def __call__(self, *args):
        # Eager hot path: skip the torch.library layer and call the chosen implementation directly.
        return active_registry().select(self, args).fn(*args)


@dataclass
class Impl:
    op: str
    name: str
    fn: Callable
    platform: str
    priority: int = 0
    supports: Callable | None = None
    note: str = ""
    dtypes: tuple | None = None  # the dtypes it claims; None: every dtype of the op its platform supports

    def verdict(self, args) -> str | None:
        """None when this implementation accepts ``args``, else the reason it does not."""
        if self.supports is None:
            return None
        try:
            ok = self.supports(*args)
        except Exception as exc:
            return f"supports() raised {type(exc).__name__}: {exc}"
        if ok is True:
            return None
        return ok if isinstance(ok, str) and ok else "supports() returned False"

    @property
    def qualname(self) -> str:
        return f"{self.platform}.{self.name}"


@dataclass(frozen=True)
class Skipped:
    op: str
    name: str
    platform: str
    reason: str


OPS: dict[str, OpDef] = {}
_MAX_CACHED_CHOICES = 1 << 14


def _key_part(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.device, a.shape, a.is_contiguous())
    if isinstance(a, (str, bool, int, torch.dtype)) or a is None:
        return a
    if isinstance(a, (list, tuple)):
        return tuple(_key_part(x) for x in a)
    return type(a)


class KernelRegistry:
    """Implementations registered by one platform (and its bases), and the cached choices."""

    def __init__(self, platform: str = ""):
        self.platform = platform
        self._impls: dict[str, list[Impl]] = {}
        self._skipped: list[Skipped] = []
        self._reference_only: dict[str, tuple[str, tuple | None]] = {}
        self._cache: dict[tuple, Impl] = {}
        self._told: set[str] = set()
        self._lock = threading.Lock()
        self.epoch = 0  # bumped by register(): CallSite choices made before it are stale

    def register(self, op: OpDef | str, fn: Callable, *, name: str, supports: Callable | None = None,
                 priority: int = 0, platform: str | None = None, note: str = "", dtypes: tuple | None = None) -> Impl:
        """Add an implementation. ``dtypes`` narrows what it claims (the conformance kit fails a kernel that
        accepts no case of a dtype it claims); by default it claims every dtype of the op its platform lists."""
        op_name = op if isinstance(op, str) else op.name
        if op_name not in OPS:
            raise KeyError(f"cannot register {name!r}: no op named {op_name!r}; known ops: {sorted(OPS)}")
        if dtypes is not None and not tuple(dtypes):
            raise ValueError(f"cannot register {name!r} for {op_name} with dtypes=(): it could never run; name the "
                             "dtypes it computes, or call registry.skip(op, name, reason) to say why it is not offered")
        impl = Impl(op_name, name, fn, platform or self.platform, priority, supports, note,
                    tuple(dtypes) if dtypes is not None else None)
        with self._lock:
            lst = self._impls.setdefault(op_name, [])
            if any(i.name == name for i in lst):
                raise ValueError(f"{op_name}: an implementation named {name!r} is already registered")
            lst.append(impl)
            lst.sort(key=lambda i: -i.priority)
            self._cache.clear()
            self.epoch += 1
        return impl

    def skip(self, op: OpDef | str, name: str, reason: str, platform: str | None = None) -> None:
        """Record an implementation the platform could not offer here (library missing, capability)."""
        op_name = op if isinstance(op, str) else op.name
        self._skipped.append(Skipped(op_name, name, platform or self.platform, reason))

    def reference_only(self, op: OpDef | str, reason: str, dtypes: tuple | None = None) -> None:
        """Declare on purpose that this platform serves ``op`` (in ``dtypes``, default all) through its plain-torch
        reference: the conformance kit then does not fail the platform for having no kernel there, and ``engine
        doctor`` shows the reason. Without this, a dtype the platform claims and no kernel serves is a failure."""
        op_name = op if isinstance(op, str) else op.name
        if op_name not in OPS:
            raise KeyError(f"reference_only: no op named {op_name!r}; known ops: {sorted(OPS)}")
        if not reason:
            raise ValueError(f"reference_only({op_name!r}): say why the reference serves it")
        self._reference_only[op_name] = (reason, tuple(dtypes) if dtypes is not None else None)

    def reference_only_reason(self, op: OpDef | str, dtype=None) -> str | None:
        """The declared reason when ``op`` (in ``dtype``) is served by its reference on purpose, else None."""
        entry = self._reference_only.get(op if isinstance(op, str) else op.name)
        if entry is None or (dtype is not None and entry[1] is not None and dtype not in entry[1]):
            return None
        return entry[0]

    def implementations(self, op: OpDef | str) -> list[Impl]:
        """Registered implementations, best first (the reference is not included)."""
        return list(self._impls.get(op if isinstance(op, str) else op.name, ()))

    def skipped(self, op: OpDef | str | None = None) -> list[Skipped]:
        name = op if isinstance(op, str) or op is None else op.name
        return [s for s in self._skipped if name is None or s.op == name]

    def select(self, op: OpDef, args) -> Impl:
        key = (op.name, *map(_key_part, args))
        impl = self._cache.get(key)
        if impl is None:
            if len(self._cache) > _MAX_CACHED_CHOICES:  # many distinct token counts: start over
                self._cache.clear()
            impl = next((i for i in self._impls.get(op.name, ()) if i.verdict(args) is None),
                        op.reference_impl)
            if impl is op.reference_impl:
                self._tell_reference(op, args)
            self._cache[key] = impl
        return impl

    def _tell_reference(self, op: OpDef, args) -> None:
        """Say once (per op and reasons) that a call the platform has kernels for fell to the plain-torch reference,
        and why each kernel declined: a slow path is never silent."""
        why = [f"{i.qualname}: {i.verdict(args)}" for i in self._impls.get(op.name, ())]
        why += [f"{s.platform}.{s.name}: {s.reason}" for s in self._skipped if s.op == op.name]
        if not why:  # the platform offers nothing for this op: the reference is its implementation
            return
        message = (f"engine: warning: op {op.name} runs on its plain-torch reference (slow) on platform "
                   f"{self.platform!r}: " + "; ".join(why))
        if message not in self._told:
            self._told.add(message)
            log.warning("%s", message)

    def explain(self, op: OpDef, args) -> list[tuple[Impl, str | None]]:
        """Every candidate (the reference last) with None if it would accept ``args``, else why not."""
        return [(i, i.verdict(args)) for i in self.implementations(op)] + [(op.reference_impl, None)]


_ACTIVE: KernelRegistry | None = None
_MAX_SITE_CHOICES = 256


class CallSite:
    """One place a model calls an op (layer 7's o_proj, say), with the implementation chosen there per step shape.

    ``site(key, *args)`` calls the op. ``key`` is computed once per forward step by the caller and must determine
    everything ``select`` looks at for this site's arguments (dtypes, devices, shapes, contiguity): for a model's
    layer, the step's token count, sequence count and block-table width do, since the weights are fixed. The first
    call with a key resolves the implementation through the active registry (``select``: supports(), the reference
    warning, the choice log); later calls cost one dict lookup instead of building a dispatch key from every
    argument. A new active registry, or a kernel registered since, clears the choices.
    """

    __slots__ = ("op", "_registry", "_epoch", "_choices")

    def __init__(self, op: OpDef):
        self.op = op
        self._registry: KernelRegistry | None = None
        self._epoch = -1
        self._choices: dict = {}

    def __call__(self, key, *args):
        registry = _ACTIVE
        if registry is None or registry is not self._registry or registry.epoch != self._epoch:
            registry = active_registry()
            self._registry, self._epoch, self._choices = registry, registry.epoch, {}
        fn = self._choices.get(key)
        if fn is None:
            if len(self._choices) >= _MAX_SITE_CHOICES:  # many distinct prefill lengths: start over
                self._choices.clear()
            fn = self._choices[key] = registry.select(self.op, args).fn
        return fn(*args)

    def chosen(self) -> dict:
        """{key: implementation function} chosen so far (for tests and tools)."""
        return dict(self._choices)


def set_active_registry(registry: KernelRegistry | None) -> None:
    global _ACTIVE
    _ACTIVE = registry


def active_registry() -> KernelRegistry:
    """The registry of the selected platform, selecting and initialising it on first use."""
    if _ACTIVE is None:
        from engine.core import plugins

        plugins.activate()
    assert _ACTIVE is not None
    return _ACTIVE
