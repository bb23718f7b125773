"""write_kv_cache: reference vs a per-token Python loop; inputs; fake; torch.ops path; errors."""


import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.kv_cache import write_kv_cache as op

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


def _loop_write(key, value, key_cache, value_cache, slot_mapping):
    kc, vc = key_cache.clone(), value_cache.clone()
    bs = kc.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            kc[slot // bs, slot % bs] = key[t]
            vc[slot // bs, slot % bs] = value[t]
    return kc, vc


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_reference_matches_loop(case, dtype, gen):
    args = op.make_inputs(case.params, dtype, "cpu", gen)
    key, value, kc, vc, slots = args
    exp_k, exp_v = _loop_write(*args)
    before = kc.clone()
    assert op.reference(key, value, kc, vc, slots) is None
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v)
    # the write really happened in place and only where a slot points
    written = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for s in slots[slots >= 0].tolist():
        written[s // kc.shape[1], s % kc.shape[1]] = True
    assert torch.equal(kc[~written], before[~written])
    assert not torch.equal(kc[written], before[written])


@pytest.mark.parametrize("case", op.cases, ids=lambda c: c.name)
def test_inputs_are_a_valid_layout(case, gen):
    key, value, kc, vc, slots = op.make_inputs(case.params, torch.float32, "cpu", gen)
    real = slots[slots >= 0]
    assert slots.dtype == torch.int64 and real.unique().numel() == real.numel()
    assert int(real.max()) < kc.shape[0] * kc.shape[1]
    if case.params.get("padding"):
        assert (slots < 0).any()


def test_fake_returns_nothing():
    with FakeTensorMode():
        k = torch.empty(4, 2, 64)
        kc = torch.empty(3, 16, 2, 64)
        out = op.torch_op(k, k, kc, kc.clone(), torch.empty(4, dtype=torch.int64))
    assert out is None


def test_torch_op_matches_call(gen):
    key, value, kc, vc, slots = op.make_inputs(op.cases[1].params, torch.bfloat16, "cpu", gen)
    kc2, vc2 = kc.clone(), vc.clone()
    torch.ops.engine.write_kv_cache(key, value, kc, vc, slots)
    op(key, value, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_bad_inputs(gen):
    key, value, kc, vc, slots = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    with pytest.raises(TypeError, match="share one dtype"):
        op.reference(key.half(), value, kc, vc, slots)
    with pytest.raises(TypeError, match="int64"):
        op.reference(key, value, kc, vc, slots.int())
    with pytest.raises(ValueError, match="contiguous"):
        op.reference(key, value, kc.transpose(2, 3).contiguous().transpose(2, 3), vc, slots)
    with pytest.raises(ValueError, match=r"\[T, Hk, D\]"):
        op.reference(key[1:], value[1:], kc, vc, slots)


def test_opcheck(gen):
    """torch.library.opcheck: schema (incl. mutation), fake impl vs real outputs, dynamic-shape tracing."""
    torch.library.opcheck(op.torch_op, op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))
