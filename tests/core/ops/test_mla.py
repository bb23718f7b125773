"""mla_decode vs a per-sequence, per-head float64 loop; sensitivity; fake shapes; torch.ops path; errors."""


import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.mla import mla_decode as op

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


def _loop(q, kv_cache, block_tables, seq_lens, scale, v_dim):
    page = kv_cache.shape[1]
    out = torch.empty(q.shape[0], q.shape[1], v_dim, dtype=torch.float64)
    for b, n in enumerate(seq_lens.tolist()):
        rows = torch.stack([kv_cache[int(block_tables[b, pos // page]), pos % page] for pos in range(n)])
        rows = rows.double()
        for h in range(q.shape[1]):
            s = rows @ q[b, h].double() * scale
            w = torch.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ rows[:, :v_dim]
    return out


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_reference_matches_loop(case, dtype, gen):
    args = op.make_inputs(case.params, dtype, "cpu", gen)
    got = op.reference(*args)
    assert got.dtype == dtype and got.shape == (*args[0].shape[:2], args[-1])
    tol = op.tolerances[dtype]
    torch.testing.assert_close(got.double(), _loop(*args), atol=tol.atol, rtol=tol.rtol)


def test_deepseek_shapes_and_default_v_dim(gen):
    q, kv, bt, lens, scale, v_dim = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    assert q.shape[-1] == kv.shape[-1] == 576 and v_dim == 512
    assert torch.equal(op.reference(q, kv, bt, lens, scale), op.reference(q, kv, bt, lens, scale, 512))
    assert torch.ops.engine.mla_decode(q, kv, bt, lens, scale).shape == (*q.shape[:2], 512)


@pytest.mark.parametrize("case", [c for c in op.cases if c.params["page_size"] > 1], ids=lambda c: c.name)
def test_reading_past_seq_len_fails(case, gen):
    args = list(op.make_inputs(case.params, torch.float32, "cpu", gen))
    page = args[1].shape[1]
    good = op.reference(*args)
    args[3] = (args[3] + page - 1) // page * page
    tol = op.tolerances[torch.float32]
    assert not torch.allclose(op.reference(*args), good, atol=tol.atol, rtol=tol.rtol)


def test_rope_part_matters(gen):
    """Scores use all Dqk channels: dropping the rope tail must change the result."""
    q, kv, bt, lens, scale, v_dim = op.make_inputs(op.cases[0].params, torch.bfloat16, "cpu", gen)
    q_latent = q.clone()
    q_latent[..., v_dim:] = 0
    tol = op.tolerances[torch.bfloat16]
    assert not torch.allclose(op.reference(q_latent, kv, bt, lens, scale, v_dim),
                              op.reference(q, kv, bt, lens, scale, v_dim), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("dtype", op.dtypes)
def test_fake_shapes(dtype):
    with FakeTensorMode():
        out = op.torch_op(torch.empty(3, 16, 576, dtype=dtype), torch.empty(9, 16, 576, dtype=dtype),
                          torch.empty(3, 4, dtype=torch.int32), torch.empty(3, dtype=torch.int32), 0.07, 512)
    assert out.shape == (3, 16, 512) and out.dtype == dtype


def test_torch_op_matches_call(gen):
    args = op.make_inputs(op.cases[3].params, torch.bfloat16, "cpu", gen)
    assert torch.equal(torch.ops.engine.mla_decode(*args), op(*args))


def test_bad_inputs(gen):
    q, kv, bt, lens, scale, v_dim = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    with pytest.raises(TypeError, match="share one dtype"):
        op.reference(q.half(), kv, bt, lens, scale, v_dim)
    with pytest.raises(TypeError, match="share one dtype"):
        op.reference(q.to(torch.int8), kv.to(torch.int8), bt, lens, scale, v_dim)
    with pytest.raises(ValueError, match="same Dqk"):
        op.reference(q[..., :512], kv, bt, lens, scale, v_dim)
    with pytest.raises(ValueError, match="v_dim"):
        op.reference(q, kv, bt, lens, scale, 600)
    with pytest.raises(TypeError, match="int32"):
        op.reference(q, kv, bt, lens.long(), scale, v_dim)
    with pytest.raises(ValueError, match="disagree on B"):
        op.reference(q[:-1], kv, bt, lens, scale, v_dim)


def test_opcheck(gen):
    """torch.library.opcheck: schema (incl. mutation), fake impl vs real outputs, dynamic-shape tracing."""
    torch.library.opcheck(op.torch_op, op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))
