"""rotary_embedding vs complex-number rotation in float64; build_cos_sin_cache vs the published formulas."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.core.ops.rotary import build_cos_sin_cache
from engine.core.ops.rotary import rotary_embedding as op

PARAMS = [pytest.param(c, dt, id=f"{c.name}-{str(dt)[6:]}") for c in op.cases for dt in op.dtypes]


def _complex_rotate(x, positions, cache, head_dim, is_neox):
    """Rotate each channel pair as a complex number z * (cos + i sin), token by token, in float64."""
    rot = cache.shape[1]
    half = rot // 2
    out = x.double().reshape(x.shape[0], -1, head_dim).clone()
    for t, pos in enumerate(positions.tolist()):
        w = torch.complex(cache[pos, :half].double(), cache[pos, half:].double())
        re_idx = torch.arange(half) if is_neox else torch.arange(0, rot, 2)
        im_idx = re_idx + half if is_neox else re_idx + 1
        z = torch.complex(out[t][:, re_idx], out[t][:, im_idx]) * w
        out[t][:, re_idx], out[t][:, im_idx] = z.real, z.imag
    return out.reshape(x.shape)


@pytest.mark.parametrize("case,dtype", PARAMS)
def test_reference_matches_complex_rotation(case, dtype, gen):
    positions, q, k, cache, head_dim, is_neox = op.make_inputs(case.params, dtype, "cpu", gen)
    q_out, k_out = op.reference(positions, q, k, cache, head_dim, is_neox)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == k_out.dtype == dtype
    tol = op.tolerances[dtype]
    for got, x in ((q_out, q), (k_out, k)):
        expected = _complex_rotate(x, positions, cache, head_dim, is_neox)
        torch.testing.assert_close(got.double(), expected, atol=tol.atol, rtol=tol.rtol)
        rot = cache.shape[1]
        tail = (slice(None), slice(None), slice(rot, None))
        h = x.shape[1] // head_dim
        assert torch.equal(got.view(-1, h, head_dim)[tail], x.view(-1, h, head_dim)[tail])
    assert not torch.equal(q_out, q)  # inputs are not mutated and the rotation did something


def test_styles_differ(gen):
    positions, q, k, cache, head_dim, _ = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    neox = op.reference(positions, q, k, cache, head_dim, True)[0]
    gptj = op.reference(positions, q, k, cache, head_dim, False)[0]
    assert not torch.allclose(neox, gptj, atol=1e-3)


def test_accepts_head_shaped_q(gen):
    positions, q, k, cache, d, neox = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    flat = op.reference(positions, q, k, cache, d, neox)
    shaped = op.reference(positions, q.view(q.shape[0], -1, d), k.view(k.shape[0], -1, d), cache, d, neox)
    assert shaped[0].shape == (q.shape[0], q.shape[1] // d, d)
    assert torch.equal(shaped[0].flatten(1), flat[0]) and torch.equal(shaped[1].flatten(1), flat[1])


def _cache_from_inv_freq(inv_freq, positions):
    """cos|sin rows for the given positions, element by element with math.cos / math.sin."""
    return torch.tensor([[math.cos(p * f) for f in inv_freq] + [math.sin(p * f) for f in inv_freq]
                         for p in positions], dtype=torch.float64)


POSITIONS = [0, 1, 2, 17, 1000, 8191]


@pytest.mark.parametrize("rot_dim,base", [(64, 10000.0), (128, 500000.0), (32, 100000.0)])
def test_cos_sin_cache_unscaled(rot_dim, base):
    cache = build_cos_sin_cache(8192, rot_dim, base, torch.float64)
    inv_freq = [base ** (-2 * j / rot_dim) for j in range(rot_dim // 2)]
    torch.testing.assert_close(cache[POSITIONS], _cache_from_inv_freq(inv_freq, POSITIONS), atol=1e-9, rtol=0)
    assert build_cos_sin_cache(16, rot_dim, base).dtype == torch.float32


def test_cos_sin_cache_linear():
    cache = build_cos_sin_cache(8192, 64, 10000.0, torch.float64, {"type": "linear", "factor": 4.0})
    inv_freq = [10000.0 ** (-2 * j / 64) / 4.0 for j in range(32)]
    torch.testing.assert_close(cache[POSITIONS], _cache_from_inv_freq(inv_freq, POSITIONS), atol=1e-9, rtol=0)


def _llama3_freqs(freqs, factor, low_freq_factor, high_freq_factor, old_context_len):
    """Meta's apply_scaling from the Llama 3.1 reference code, a plain loop. Also counts the regimes."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs, regimes = [], set()
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
            regimes.add("high")
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / factor)
            regimes.add("low")
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
            regimes.add("mid")
    return new_freqs, regimes


@pytest.mark.parametrize("rot_dim,base,scaling", [
    (128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),  # Llama 3.1 8B
    (64, 500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}),  # Llama 3.2 1B
])
def test_cos_sin_cache_llama3(rot_dim, base, scaling):
    freqs = [base ** (-2 * j / rot_dim) for j in range(rot_dim // 2)]
    new, regimes = _llama3_freqs(freqs, scaling["factor"], scaling["low_freq_factor"],
                                 scaling["high_freq_factor"], scaling["original_max_position_embeddings"])
    assert regimes == {"high", "mid", "low"}  # the case exercises all three branches
    cache = build_cos_sin_cache(8192, rot_dim, base, torch.float64, scaling)
    torch.testing.assert_close(cache[POSITIONS], _cache_from_inv_freq(new, POSITIONS), atol=1e-9, rtol=0)


def test_cos_sin_cache_rejects_unknown_scaling():
    with pytest.raises(ValueError, match="longrope"):
        build_cos_sin_cache(16, 64, 10000.0, scaling={"rope_type": "longrope", "factor": 4.0})
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        build_cos_sin_cache(16, 64, 10000.0, scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="even"):
        build_cos_sin_cache(16, 63, 10000.0)


@pytest.mark.parametrize("dtype", op.dtypes)
def test_fake_shapes(dtype):
    with FakeTensorMode():
        q, k = torch.empty(5, 9 * 64, dtype=dtype), torch.empty(5, 3 * 64, dtype=dtype)
        qo, ko = op.torch_op(torch.empty(5, dtype=torch.int64), q, k, torch.empty(100, 32), 64, True)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == ko.dtype == dtype


def test_torch_op_matches_call(gen):
    args = op.make_inputs(op.cases[2].params, torch.bfloat16, "cpu", gen)
    for a, b in zip(torch.ops.engine.rotary_embedding(*args), op(*args), strict=True):
        assert torch.equal(a, b)


def test_bad_inputs(gen):
    positions, q, k, cache, d, neox = op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen)
    with pytest.raises(TypeError, match="int64"):
        op.reference(positions.int(), q, k, cache, d, neox)
    with pytest.raises(ValueError, match="H\\*"):
        op.reference(positions, q[:, :-1], k, cache, d, neox)
    with pytest.raises(ValueError, match="rot_dim"):
        op.reference(positions, q, k, build_cos_sin_cache(64, 2 * d, 10000.0), d, neox)
    with pytest.raises(TypeError, match="cos_sin_cache"):
        op.reference(positions, q, k, cache.double(), d, neox)


def test_opcheck(gen):
    """torch.library.opcheck: schema (incl. mutation), fake impl vs real outputs, dynamic-shape tracing."""
    torch.library.opcheck(op.torch_op, op.make_inputs(op.cases[0].params, torch.float32, "cpu", gen))


@pytest.mark.parametrize("params", [
    {"factor": 40.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
     "mscale_all_dim": 1.0},  # DeepSeek-V3's kind (mscale_all_dim apart)
    {"factor": 4.0, "original_max_position_embeddings": 128},  # defaults: beta 32/1, attention factor from factor
    {"factor": 2.0, "original_max_position_embeddings": 256, "attention_factor": 1.3, "truncate": False},
], ids=["deepseek", "defaults", "attention_factor"])
def test_cos_sin_cache_yarn_matches_transformers(params):
    """YaRN's frequencies and cos/sin factor against transformers' own computation (its fp32 frequencies: 1e-4 at
    the table's far end)."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, **params}
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=1024,
                                   rope_parameters=rope)
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    freqs = torch.arange(1024, dtype=torch.float64)[:, None] * inv_freq.double()[None]
    want = torch.cat([freqs.cos(), freqs.sin()], -1) * attention
    got = build_cos_sin_cache(1024, 64, 10000.0, torch.float64, rope)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
