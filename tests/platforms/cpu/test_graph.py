"""CPU graphs (platforms/cpu/graph.py): a recorded function replayed on new inputs gives what running it again
gives, for native kernels, plain-torch work between them and a GGUF linear; what a replay cannot redo is refused
and leaves the native module as it was."""

from __future__ import annotations

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
