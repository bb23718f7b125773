"""Native rotary_write_kv (rotary of q, and of k straight into the paged cache with v beside it) against the op's
reference, for every ISA variant this CPU runs, with 1 and 2 threads: q/k/v as slices of one fused projection (how
the model passes them), padding slots, every storage dtype; errors that must leave the caches untouched; refusals."""

import pytest
import torch

from engine.core.ops.rotary import build_cos_sin_cache
from engine.core.ops.rotary_kv import rotary_write_kv

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CASES = [(9, 3, 64, 64, True), (8, 2, 128, 128, True), (4, 4, 64, 64, False), (3, 2, 64, 20, True),
         (2, 1, 16, 2, False)]  # (hq, hk, head_dim, rot_dim, is_neox), as test_native_small_ops' rotary cases


def native(registry):
    (impl,) = registry.implementations(rotary_write_kv)
    return impl


def inputs(t, hq, hk, d, rot, neox, dtype, gen, num_blocks=40, block_size=16, padding=0):
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=gen).to(dtype)
    q, k, v = (y.view(t, -1, d) for y in qkv.split([hq * d, hk * d, hk * d], dim=-1))
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:t]
    if padding:
        slots[torch.randperm(t, generator=gen)[:padding]] = -1
    caches = [torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype) for _ in range(2)]
    q_out = torch.randn(t, hq, d, generator=gen).to(dtype)  # overwritten: its old values must not show
    cache = build_cos_sin_cache(4096, rot, 10000.0)
    return [torch.randint(0, 4096, (t,), generator=gen), q, k, v, cache, d, neox, q_out, *caches, slots]


def run_both(impl, args):
    ours, ref = list(args), list(args)
    for i in (7, 8, 9):  # the outputs, written in place
        ours[i], ref[i] = args[i].clone(), args[i].clone()
    assert impl.verdict(ours) is None, impl.verdict(ours)
    impl.fn(*ours)
    rotary_write_kv.reference(*ref)
    return [ours[i] for i in (7, 8, 9)], [ref[i] for i in (7, 8, 9)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "hq{}_hk{}_d{}_rot{}_{}".format(
    *c[:4], "neox" if c[4] else "gptj"))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_matches_reference(case, dtype, isa, threads, registry, gen):
    impl = native(registry)
    for t, padding in ((1, 0), (7, 2), (100, 9)):  # 100 tokens: split over 2 threads
        args = inputs(t, *case, dtype, gen, padding=padding)
        assert t == 1 or not (args[1].is_contiguous() or args[3].is_contiguous())  # views of the fused projection
        got, want = run_both(impl, args)
        for g, w in zip(got, want, strict=True):  # the rotary rounds as the reference does: bit for bit
            assert torch.equal(g, w), (g.float() - w.float()).abs().max()


def test_bad_slots_and_tokens_raise_before_writing(registry, gen):
    impl = native(registry)
    args = inputs(5, 4, 2, 32, 32, True, torch.float32, gen, num_blocks=2, block_size=4)
    args[10] = torch.tensor([0, 3, 8, 1, 2])  # 8 slots: slot 8 is past the end
    before = [a.clone() for a in args[7:10]]
    with pytest.raises(ValueError, match=r"slot_mapping\[2\] = 8 is past the cache's 8 slots"):
        impl.fn(*args)
    args[10] = torch.tensor([0, 3, 7, 1])  # one slot short
    with pytest.raises(ValueError, match="number of tokens"):
        impl.fn(*args)
    args[10], args[0] = torch.tensor([0, 3, 7, 1, 2]), torch.tensor([0, 1, 4096, 2, 3])
    with pytest.raises(ValueError, match=r"positions\[2\] = 4096"):
        impl.fn(*args)
    for b, a in zip(before, args[7:10], strict=True):
        assert torch.equal(b, a)  # nothing written


def test_refusals(registry, gen):
    impl = native(registry)
    args = inputs(3, 4, 2, 32, 32, True, torch.float32, gen)
    assert impl.verdict(args) is None
    bad = {
        "int32 slots": {10: args[10].int()},
        "bf16 value cache": {9: args[9].bfloat16()},
        "strided key cache": {8: args[8].transpose(0, 1)},
        "strided q_out": {7: torch.randn(3, 4, 64, generator=gen)[:, :, :32]},
        "v of another shape": {3: args[3][:, :1]},
    }
    for why, change in bad.items():
        changed = [change.get(i, a) for i, a in enumerate(args)]
        assert impl.verdict(changed) is not None, why
