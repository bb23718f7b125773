"""ModelRunner takes its KV cache from the platform (Platform.empty_kv_caches): one (key, value) pair per layer of
[num_blocks, block_size, num_kv_heads, head_dim]; the base platform's are plain uninitialized tensors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.core.engine.model_runner import ModelRunner
from engine.core.engine.sampling_params import SamplingParams
from engine.core.engine.sequence import Sequence
from engine.core.platform import Platform


def model(layers=3, kv_heads=2, head_dim=8, dtype=torch.float32):
    cfg = SimpleNamespace(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                          kv_cache_layout=(2, kv_heads, head_dim))
    return SimpleNamespace(cfg=cfg, dtype=dtype, device=torch.device("cpu"))


def test_base_platform_caches():
    runner = ModelRunner(model(dtype=torch.bfloat16), num_blocks=5, block_size=4)
    assert len(runner.kv_caches) == 3
    tensors = [t for pair in runner.kv_caches for t in pair]
    assert all(t.shape == (5, 4, 2, 8) and t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors)
    assert len({t.data_ptr() for t in tensors}) == 6


def test_runner_asks_its_platform():
    calls = []

    class Recording(Platform):
        name = "recording"

        def empty_kv_caches(self, count, shape, dtype, device):
            calls.append((count, shape, dtype, device))
            return super().empty_kv_caches(count, shape, dtype, device)

    runner = ModelRunner(model(layers=2), num_blocks=7, block_size=16, platform=Recording())
    assert calls == [(2, (7, 16, 2, 8), torch.float32, torch.device("cpu"))]
    assert [p[0].shape for p in runner.kv_caches] == [(7, 16, 2, 8)] * 2


def test_runner_reports_the_highest_block_a_step_writes():
    reached = []

    class Recording(Platform):
        name = "recording"

        def kv_blocks_reached(self, caches, blocks):
            reached.append(blocks)

    runner = ModelRunner(model(), num_blocks=20, block_size=4, platform=Recording())
    a, b = Sequence(list(range(9)), SamplingParams()), Sequence(list(range(4)), SamplingParams())
    a.block_table, b.block_table = [7, 2], [11]
    runner._host_batch([(a, 6), (b, 3)])  # slots up to block 11's
    assert reached == [12]
    a.num_computed_tokens, b.num_computed_tokens = 6, 3
    runner._host_batch([(a, 0), (b, 0)])  # no slot: nothing new
    runner._host_batch([(b, 1)])  # block 11 again: nothing new
    assert reached == [12]
    a.block_table.append(15)
    runner._host_batch([(a, 3)])  # positions 6..8: blocks 2 and 15
    assert reached == [12, 16]
