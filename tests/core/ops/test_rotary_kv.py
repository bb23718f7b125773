"""rotary_write_kv: equal to rotary_embedding then write_kv_cache (its contract), padding slots untouched, q_out
fully overwritten; shape errors name the argument."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops.kv_cache import write_kv_cache
from engine.core.ops.rotary import rotary_embedding
from engine.core.ops.rotary_kv import rotary_write_kv as op

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_equals_the_two_ops(case, dtype, gen):
    args = op.make_inputs(case.params, dtype, "cpu", gen)
    positions, q, k, v, cache, d, neox, q_out, kc, vc, slots = args
    kc0, vc0 = kc.clone(), vc.clone()
    q_rot, k_rot = rotary_embedding.reference(positions, q, k, cache, d, neox)
    kc_want, vc_want = kc.clone(), vc.clone()
    write_kv_cache.reference(k_rot, v, kc_want, vc_want, slots)
    assert op.reference(*args) is None
    assert torch.equal(q_out, q_rot) and torch.equal(kc, kc_want) and torch.equal(vc, vc_want)
    untouched = torch.ones(kc.shape[0] * kc.shape[1], dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(kc.flatten(0, 1)[untouched], kc0.flatten(0, 1)[untouched])
    assert torch.equal(vc.flatten(0, 1)[untouched], vc0.flatten(0, 1)[untouched])
    assert not torch.equal(q_rot, q)  # the rotation did something the check can see


def test_shape_errors_name_the_argument(gen):
    args = list(op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))
    args[7] = args[7][:, :-1]  # q_out with a head missing
    with pytest.raises(ValueError, match="q_out"):
        op.reference(*args)
    args = list(op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))
    args[3] = args[3].flatten(1)  # v as [T, Hk*D]
    with pytest.raises(ValueError, match="v must be"):
        op.reference(*args)
