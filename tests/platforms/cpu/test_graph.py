"""CPU graphs (platforms/cpu/graph.py): a recorded function replayed on new inputs gives what running it again
gives, for native kernels, plain-torch work between them and a GGUF linear; what a replay cannot redo is refused
and leaves the native module as it was."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.core.ops.gguf_quant import random_gguf_weight
from engine.platforms.cpu import _native
from engine.platforms.cpu.graph import capture
from engine.platforms.cpu.kernels.gguf import _fused_linear
from engine.platforms.cpu.kernels.norm import _fused_add_rms_norm, _rms_norm
from engine.platforms.cpu.kernels.small_ops import _silu_and_mul


@pytest.mark.parametrize("rows", [1, 3])
def test_replay_on_new_inputs_equals_a_fresh_run(rows):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    hidden, inter = 64, 96
    table = torch.randn(50, hidden, generator=gen)
    w_norm, w_post = torch.rand(hidden, generator=gen) + 0.5, torch.rand(hidden, generator=gen) + 0.5
    raw_up = random_gguf_weight(2 * inter, hidden, 3, "cpu", gen)
    raw_down = random_gguf_weight(hidden, inter, 3, "cpu", gen)
    ids = torch.zeros(rows, dtype=torch.int64)  # the static input buffer

    def step():
        x = table[ids]  # torch work the replay must redo
        h = _rms_norm(x, w_norm, 1e-6)
        up = _fused_linear(h, raw_up, 3, hidden)
        down = _fused_linear(_silu_and_mul(up), raw_down, 3, inter)
        y, residual = _fused_add_rms_norm(down, x, w_post, 1e-6)
        return (y * 2 + residual).sum(dim=-1)  # more torch work after the last kernel

    with torch.inference_mode():
        replay, out = capture(step)
        assert replay.num_calls >= 6  # 5 native calls and the torch work
        assert replay.num_native == 5  # all five run by the native loop
        for _ in range(3):
            ids.copy_(torch.randint(0, 50, (rows,), generator=gen))
            replay()
            assert torch.equal(out, step())
    assert _native.gguf_linear is _fused_linear.__globals__["_native"].gguf_linear  # module restored


def test_a_host_read_is_refused_and_the_native_module_restored():
    before = {n: getattr(_native, n) for n in dir(_native) if not n.startswith("_")}
    x = torch.randn(4, 32)
    w = torch.ones(32)

    def reads_host():
        y = _rms_norm(x, w, 1e-6)
        return y * float(y.max())

    with pytest.raises(RuntimeError, match="cannot capture"):
        capture(reads_host)
    with pytest.raises(RuntimeError, match="cannot capture"):
        capture(lambda: x[x > 0])  # a data-dependent shape
    assert {n: getattr(_native, n) for n in dir(_native) if not n.startswith("_")} == before


def test_views_and_allocations_are_not_replayed_but_copies_are():
    x = torch.randn(6, 8)
    src = torch.zeros(6, 8)

    def fn():
        v = x.view(48)  # a view: nothing to redo
        e = torch.empty(3)  # fresh memory: nothing to redo
        c = x.t().contiguous()  # a copy: redone
        return v, e, c

    replay, (v, _, c) = capture(fn)
    assert replay.num_calls == 1
    x.copy_(src + 1)
    replay()
    assert torch.equal(c, x.t()) and torch.equal(v, x.view(48))


def test_a_wrapped_kernel_replays_through_its_wrapper():
    """A profiler that wraps a kernel function (benchmarks/bench_cpu_vs_llamacpp.py times each call) still sees
    every replayed call: only the module's own functions replay in the native loop."""
    x, w = torch.randn(3, 2 * 16), torch.rand(16) + 0.5
    seen = []
    original = _native.silu_and_mul

    def counted(*args):
        seen.append(args)
        return original(*args)

    _native.silu_and_mul = counted
    try:
        with torch.inference_mode():
            replay, out = capture(lambda: _rms_norm(_silu_and_mul(x), w, 1e-6))
    finally:
        _native.silu_and_mul = original
    assert (replay.num_calls, replay.num_native, len(seen)) == (2, 1, 1)
    x.copy_(torch.randn(3, 32))
    replay()
    assert len(seen) == 2
    with torch.inference_mode():
        assert torch.equal(out, _rms_norm(_silu_and_mul(x), w, 1e-6))


def test_native_recording_is_per_thread_and_checked():
    x, out = torch.randn(2, 32), torch.empty(2, 16)

    def silu():
        _native.silu_and_mul(x.data_ptr(), 32, out.data_ptr(), 16, 2, 16, _native.DTYPE_F32)

    with pytest.raises(RuntimeError, match="not recording"):
        _native._record_stop()
    _native._record_start()
    try:
        with pytest.raises(RuntimeError, match="already recording"):
            _native._record_start()
        worker = threading.Thread(target=silu)  # another thread's kernels are not this recording's
        worker.start()
        worker.join()
        assert _native._record_count() == 0
        silu()
        silu()
        assert _native._record_count() == 2
    finally:
        program = _native._record_stop()
    assert len(program) == 2 and _native._record_count() == 0
    x.copy_(torch.randn(2, 32))
    program.run(1, 2)
    assert torch.allclose(out, torch.nn.functional.silu(x[:, :16]) * x[:, 16:], rtol=1e-5, atol=1e-6)
    with pytest.raises(IndexError, match="not within its 2"):
        program.run(1, 3)
