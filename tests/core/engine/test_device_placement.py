"""The engine keeps everything a step reads on the platform's device, and sizes its KV cache from that device's
memory. A test platform on torch's ``meta`` device stands in for a GPU: no data, but every op checks that its
tensors share one device, so a weight or table left on the host fails here the way it fails on a real GPU."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.engine.memory import DeviceMemoryError, activation_reserve, kv_bytes_per_token, weight_nbytes
from engine.core.engine.sequence import Sequence
from engine.core.loader import load_checkpoint
from engine.core.platform import Platform
from engine.core.testing.random_model import write_random_llama

GIB = 1 << 30


class MetaPlatform(Platform):
    """A device of its own ('meta'), with as much memory as the test says."""

    name = "meta-test"
    device_type = "meta"
    memory_sized_kv_cache = True

    def __init__(self, free: int = 8 * GIB, total: int = 10 * GIB):
        self.free, self.total = free, total

    @classmethod
    def probe(cls):
        return True, "test platform"

    def memory_info(self, index: int = 0):
        return self.free, self.total


def _tensors(obj, seen=None, path="llm"):
    """Every tensor reachable from ``obj`` through attributes, lists, tuples and dicts, with its path."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _tensors(x, seen, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _tensors(x, seen, f"{path}[{k!r}]")
    elif type(obj).__module__.startswith("engine."):
        attrs = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
        for cls in type(obj).__mro__:  # __slots__ classes (the models' Linear) hold their tensors there
            attrs.update({k: getattr(obj, k) for k in getattr(cls, "__slots__", ()) if hasattr(obj, k)})
        for k, x in attrs.items():
            yield from _tensors(x, seen, f"{path}.{k}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_random_llama(tmp_path_factory.mktemp("model"), vocab_size=2048, hidden_size=512,
                                  intermediate_size=1024, num_layers=4, max_position=8192))


@pytest.fixture(scope="module")
def meta_llm(model_dir):
    return LLM(model_dir, platform=MetaPlatform(), max_model_len=512, max_num_seqs=8, max_num_batched_tokens=256)


def test_weights_kv_cache_and_rotary_tables_live_on_the_device(meta_llm):
    found = dict(_tensors(meta_llm.model, path="model"))
    found.update(_tensors(meta_llm.runner.kv_caches, path="kv_caches"))
    assert len(found) > 30  # the walk reached the layers' weights, norms, rotary tables and caches
    off = {p: t.device for p, t in found.items() if t.device.type != "meta"}
    assert not off, f"left off the platform's device: {sorted(off.items())[:5]}"


def test_a_decode_step_runs_entirely_on_the_device(meta_llm, monkeypatch):
    # The KV-write reference masks out padding slots (a nonzero); on meta that needs this switch.
    monkeypatch.setattr(torch.fx.experimental._config, "meta_nonzero_assume_all_nonzero", True)
    seq = Sequence(list(range(1, 21)), SamplingParams(max_tokens=4))
    assert meta_llm.block_manager.allocate(seq)
    try:
        seq.num_computed_tokens = len(seq) - 1  # the prompt is cached: one new token, the decode kernels
        ids, batch, sampled = meta_llm.runner.build_batch([(seq, 1)])
        assert batch.is_decode and sampled == [seq]
        for name in ("positions", "slot_mapping", "block_tables", "seq_lens", "cu_seqlens_q", "logits_indices"):
            assert getattr(batch, name).device.type == "meta", name
        hidden = meta_llm.model.forward(ids, batch, meta_llm.runner.kv_caches)
        logits = meta_llm.model.logits(hidden[batch.logits_indices])
        assert logits.device.type == "meta" and logits.shape == (1, meta_llm.config.vocab_size)
    finally:
        meta_llm.block_manager.free(seq)


def test_kv_cache_is_sized_from_device_memory(model_dir):
    small = LLM(model_dir, platform=MetaPlatform(free=3 * GIB, total=4 * GIB), max_model_len=512,
                gpu_memory_utilization=0.9, max_num_seqs=8, max_num_batched_tokens=256)
    cfg, dtype = small.config, small.model.dtype
    weights = weight_nbytes(load_checkpoint(model_dir, dtype).weights.values())
    budget = int(4 * GIB * 0.9) - 1 * GIB
    expect = (budget - weights - activation_reserve(cfg, dtype, 256, 8)) // (kv_bytes_per_token(cfg, dtype) * 16)
    assert small.runner.num_blocks == expect
    assert small.runner.num_blocks * 16 > 10_000  # a small model leaves GiBs for the cache


def test_a_model_that_does_not_fit_is_refused_before_it_is_moved(model_dir):
    with pytest.raises(DeviceMemoryError, match="weights need .* GiB .*gpu_memory_utilization"):
        LLM(model_dir, platform=MetaPlatform(free=20 << 20, total=24 << 20))


def test_a_cache_that_cannot_hold_one_full_sequence_is_refused(model_dir):
    # ~44 MiB of fp32 weights; 4 layers x 2 x 2 KV heads x 64 x 4 bytes = 4 KiB a token: 8192 tokens need 32 MiB
    with pytest.raises(DeviceMemoryError, match="max_model_len"):
        LLM(model_dir, platform=MetaPlatform(free=72 << 20, total=72 << 20), max_model_len=8192,
            gpu_memory_utilization=1.0, max_num_seqs=8, max_num_batched_tokens=64)


def test_an_explicit_cache_larger_than_the_device_is_refused(model_dir):
    with pytest.raises(DeviceMemoryError, match="fewer blocks"):
        LLM(model_dir, platform=MetaPlatform(free=1 * GIB, total=1 * GIB), num_kv_blocks=1_000_000,
            max_model_len=512)


def test_gpu_memory_utilization_must_be_a_fraction(model_dir):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(model_dir, platform=MetaPlatform(), gpu_memory_utilization=1.5)
