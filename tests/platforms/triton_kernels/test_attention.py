"""Triton paged attention (platforms/triton_kernels/attention.py) against the op references.

Decode: GQA ratios 1, 3, 4 (and a group split over programs), block sizes 16 and 32, head dims 64, 80 (not a
power of two) and 128, contexts off block multiples, split-KV with several partitions (forced, and from the
shape heuristic) including partitions past a sequence's end. Prefill: several sequences of different lengths
in one batch, q_len < seq_len (prefix-cache hits / chunked prefill), q_len = 0 sequences, small tiles so that
one sequence spans many query and key tiles, the GQA group packed into one
program's rows (whole, uneven, split over programs). fp32, fp16 and bf16. Every cache slot no sequence owns is
poisoned with NaN/inf. supports() declining wrong devices, dtypes and shapes with a reason; no host read.
Under the Triton interpreter on CPU when there is no GPU (keep shapes small: the whole file runs in ~20 s)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from engine.core.ops import OPS, Case, KernelRegistry
from engine.core.ops.attention import make_paged_layout, paged_attention_decode, paged_attention_prefill
from engine.core.testing.conformance import Check, run_check
from engine.platforms.triton_kernels import attention as kmod
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DT_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    # Our own registry (the session one imports every kernel module, some still being written), plus variants
    # with forced split-KV partitions and small prefill tiles so that tiny inputs exercise every code path.
    reg = KernelRegistry("triton")
    kmod.register(reg, DEVICE, CAPABILITY)
    sd, sp = kmod.make_supports(DEVICE, CAPABILITY)
    reg.register(paged_attention_decode, functools.partial(kmod.paged_decode, partition_tokens=64),
                 name="split64", supports=sd)
    reg.register(paged_attention_decode, functools.partial(kmod.paged_decode, partition_tokens=32,
                                                           config={"BLOCK_N": 16, "BLOCK_G": 16}),
                 name="split32_bn16", supports=sd)
    reg.register(paged_attention_prefill, functools.partial(kmod.paged_prefill, config={"BLOCK_M": 16, "BLOCK_N": 16}),
                 name="tiles16", supports=sp)
    # the whole GQA group stacked along M (group 3: 10 queries x 3 heads in 32 rows, 2 rows idle; group 4: 8 x 4)
    reg.register(paged_attention_prefill, functools.partial(kmod.paged_prefill, config={"BLOCK_M": 32, "BLOCK_N": 16,
                                                                                        "G_TILE": 4}),
                 name="packed", supports=sp)
    return reg


def _shape(batch, hq, hk, d, bs, max_len, **extra):
    return {"batch": batch, "hq": hq, "hk": hk, "head_dim": d, "block_size": bs, "max_len": max_len, **extra}


# ---------------------------------------------------------------------------------------------------------
# decode
# ---------------------------------------------------------------------------------------------------------

DECODE = [  # (impl, params)
    ("triton_paged_decode", _shape(4, 9, 3, 64, 16, 80)),  # SmolLM2 heads, GQA 3
    ("triton_paged_decode", _shape(3, 4, 4, 128, 32, 100)),  # MHA
    ("triton_paged_decode", _shape(2, 8, 2, 128, 16, 600)),  # GQA 4; the heuristic splits this into 3 partitions
    ("triton_paged_decode", _shape(3, 6, 2, 80, 32, 60)),  # head_dim not a power of two
    ("split64", _shape(3, 8, 2, 64, 16, 230)),  # 4 partitions, short sequences leave some empty
    ("split64", _shape(2, 3, 1, 128, 32, 150)),  # MQA, GQA 3, block 32
    ("split32_bn16", _shape(2, 40, 1, 64, 16, 100)),  # group 40 over three programs of 16 heads, 4 partitions
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
@pytest.mark.parametrize("impl,params", DECODE, ids=lambda x: x if isinstance(x, str) else
                         "hq{hq}_hk{hk}_d{head_dim}_bs{block_size}_len{max_len}".format(**x))
def test_decode_matches_reference(registry, impl, params, dtype, seed):
    run_case(registry, "paged_attention_decode", impl, params, dtype, seed)


def test_decode_partition_heuristic():
    # B=64, 8 KV heads: 512 programs already fill 132 SMs twice, no split; one long sequence is split.
    assert kmod.decode_partitions(64, 8, 4096, 32, 132) == (1, 4096)
    parts, tokens = kmod.decode_partitions(1, 8, 32768, 32, 132)
    assert 16 <= parts <= kmod._MAX_PARTITIONS and tokens % 32 == 0 and parts * tokens >= 32768
    assert (parts - 1) * tokens < 32768  # no partition lies wholly past the context
    for b, ctx in ((1, 1), (3, 17), (2, 5000), (1, 10**6)):
        parts, tokens = kmod.decode_partitions(b, 2, ctx, 64, 132)
        assert 1 <= parts <= kmod._MAX_PARTITIONS and tokens % 64 == 0 and (parts - 1) * tokens < ctx <= parts * tokens


# ---------------------------------------------------------------------------------------------------------
# prefill
# ---------------------------------------------------------------------------------------------------------

PREFILL = [
    ("triton_paged_prefill", _shape(4, 9, 3, 64, 16, 70)),  # mixed: full and partial q_len
    ("triton_paged_prefill", _shape(3, 4, 4, 128, 32, 90, q_mode="partial")),  # MHA, prefix-cache hits
    ("tiles16", _shape(3, 8, 2, 64, 16, 100)),  # GQA 4, many q and k tiles per sequence
    ("tiles16", _shape(3, 6, 2, 80, 32, 50, q_mode="partial")),  # GQA 3, head_dim 80, block 32
    ("tiles16", _shape(1, 3, 1, 128, 16, 77, q_mode="full")),
    ("packed", _shape(3, 8, 2, 64, 16, 100)),  # GQA 4 packed: 8 queries x 4 heads per tile
    ("packed", _shape(3, 6, 2, 80, 32, 50, q_mode="partial")),  # GQA 3 packed, rows past 10 x 3 idle
    ("packed", _shape(2, 10, 2, 64, 16, 60)),  # GQA 5 over two programs of 4 + 1 heads (short last chunk)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
@pytest.mark.parametrize("impl,params", PREFILL, ids=lambda x: x if isinstance(x, str) else
                         "hq{hq}_hk{hk}_d{head_dim}_bs{block_size}_len{max_len}".format(**x))
def test_prefill_matches_reference(registry, impl, params, dtype, seed):
    run_case(registry, "paged_attention_prefill", impl, params, dtype, seed)


def test_prefill_g_tile():
    assert kmod.prefill_g_tile(4, 128) == 4  # the whole group: 32 queries x 4 heads
    assert kmod.prefill_g_tile(8, 64) == 4  # keep >= 16 queries per tile: the group over two programs
    assert kmod.prefill_g_tile(1, 128) == 1 and kmod.prefill_g_tile(4, 16) == 1
    assert kmod.prefill_g_tile(4, 128, 1) == 1 and kmod.prefill_g_tile(4, 32, 8) == 4


@pytest.mark.parametrize("op_name,impl,params", [
    ("paged_attention_decode", "split64", _shape(3, 8, 2, 64, 16, 150)),
    ("paged_attention_prefill", "tiles16", _shape(3, 6, 2, 64, 32, 60)),
], ids=["decode", "prefill"])
def test_strided_views_of_every_input(registry, op_name, impl, params, seed):
    """The conformance kit's strided variant: every input (caches too) a non-contiguous view of the same values."""
    op = OPS[op_name]
    impl = next(i for i in registry.implementations(op) if i.name == impl)
    run_check(Check(op, impl, Case("strided", params), torch.float16, strided=True), DEVICE, seed)


# ---------------------------------------------------------------------------------------------------------
# hand-built inputs: poisoned caches, empty sequences, strided views
# ---------------------------------------------------------------------------------------------------------


def _poisoned_kv(lens, bs, hk, d, dtype, gen):
    """Random K/V at every position < seq_len of each sequence, NaN / +inf / -inf in every other slot."""
    table, nb = make_paged_layout(lens, bs, gen)
    owned = torch.zeros(nb * bs, dtype=torch.bool)
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        owned[table[b, pos // bs].long() * bs + pos % bs] = True
    caches = []
    for _ in range(2):
        c = torch.randn(nb * bs, hk, d, generator=gen)
        poison = torch.tensor([math.nan, math.inf, -math.inf])[torch.arange(nb * bs) % 3]
        c[~owned] = poison[~owned][:, None, None]
        caches.append(c.view(nb, bs, hk, d).to(dtype).to(DEVICE))
    return caches[0], caches[1], table.to(DEVICE)


def _check(op, impl, args):
    got = impl(*args)
    want = op.reference(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
    got = got.cpu()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.isfinite(got).all(), "the kernel read a poisoned slot"
    tol = op.tolerances[want.dtype]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DT_IDS.get)
def test_decode_poisoned_cache_and_strided_inputs(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    lens, bs, hq, hk, d = [1, 47, 130, 64], 16, 8, 2, 64
    kc, vc, table = _poisoned_kv(lens, bs, hk, d, dtype, gen)
    q = torch.randn(len(lens), hq, 2 * d, generator=gen).to(dtype).to(DEVICE)[:, :, :d]  # a view: rows not dense
    wide = torch.zeros(table.shape[0], 2 * table.shape[1], dtype=torch.int32, device=DEVICE)
    wide[:, ::2] = table
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    args = (q, kc, vc, wide[:, ::2], seq_lens, d ** -0.5)
    assert not q.is_contiguous() and not args[3].is_contiguous()
    assert kmod.make_supports(DEVICE, CAPABILITY)[0](*args) is True
    for parts in (None, 32):
        _check(paged_attention_decode, functools.partial(kmod.paged_decode, partition_tokens=parts), args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=DT_IDS.get)
def test_prefill_poisoned_cache_empty_sequences_strided_q(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    lens, q_lens = [40, 5, 33, 70, 16], [17, 0, 33, 1, 0]  # q_len 0: a sequence with nothing to compute
    bs, hq, hk, d = 16, 6, 2, 64
    kc, vc, table = _poisoned_kv(lens, bs, hk, d, dtype, gen)
    q = torch.randn(sum(q_lens), hq, d + 16, generator=gen).to(dtype).to(DEVICE)[..., 8:8 + d]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    args = (q, kc, vc, table, cu, torch.tensor(lens, dtype=torch.int32, device=DEVICE), d ** -0.5)
    assert kmod.make_supports(DEVICE, CAPABILITY)[1](*args) is True
    for cfg in (None, {"BLOCK_M": 16, "BLOCK_N": 16}, {"BLOCK_M": 32, "BLOCK_N": 16, "G_TILE": 3}):
        _check(paged_attention_prefill, functools.partial(kmod.paged_prefill, config=cfg), args)


def test_no_host_read(monkeypatch, seed):
    """The wrappers decide everything from shapes: reading any tensor value back (what a CUDA graph cannot
    capture) raises here. Run once first so that compilation (which may inspect arguments) is out of the way."""
    gen = torch.Generator().manual_seed(seed)
    lens, bs, hq, hk, d = [5, 90], 16, 4, 2, 64
    kc, vc, table = _poisoned_kv(lens, bs, hk, d, torch.float32, gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, hq, d, generator=gen).to(DEVICE)
    qp = torch.randn(7, hq, d, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    calls = [lambda: kmod.paged_decode(q, kc, vc, table, seq_lens, 0.1, partition_tokens=32),
             lambda: kmod.paged_prefill(qp, kc, vc, table, cu, seq_lens, 0.1)]
    for call in calls:
        call()

    def boom(*_a, **_k):
        raise AssertionError("a tensor value was read back on the host")

    if DEVICE == "cuda":
        for name in ("item", "tolist", "__bool__", "__int__", "__index__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, boom)
        for call in calls:
            call()
    else:  # the interpreter itself reads values on the host: check the wrapper up to the launch instead
        launched = []
        for kern in ("_decode_kernel", "_decode_reduce_kernel", "_prefill_kernel"):
            monkeypatch.setattr(kmod, kern, _Recorder(launched))
        for name in ("item", "tolist", "__bool__", "__int__", "__index__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, boom)
        for call in calls:
            call()
        assert len(launched) == 3  # decode + reduce, prefill


class _Recorder:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        assert all(isinstance(g, int) for g in grid)
        return lambda *a, **k: self.log.append(grid)


# ---------------------------------------------------------------------------------------------------------
# supports()
# ---------------------------------------------------------------------------------------------------------


def _decode_args(device="cpu", dtype=torch.float16, d=64, hq=8, hk=2, bs=16, cache_contig=True):
    q = torch.randn(2, hq, d).to(dtype)
    kc = torch.randn(10, bs, hk, d).to(dtype)
    vc = torch.randn(10, bs, hk, d).to(dtype)
    if not cache_contig:
        kc = torch.randn(10, bs, hk, 2 * d).to(dtype)[..., :d]
    bt = torch.zeros(2, 5, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    return [t.to(device) for t in (q, kc, vc, bt, lens)] + [0.125]


def test_supports_declines_with_a_reason():
    sd, sp = kmod.make_supports("cpu")
    assert sd(*_decode_args()) is True
    cases = {
        "device": (kmod.make_supports("cuda")[0], _decode_args()),
        "dtype": (sd, _decode_args(dtype=torch.float64)),
        "head_dim": (sd, _decode_args(d=72)),
        "multiple of Hk": (sd, _decode_args(hq=9, hk=2)),
    }
    for word, (fn, args) in cases.items():
        why = fn(*args)
        assert isinstance(why, str) and word in why, (word, why)
    assert sd(*_decode_args(cache_contig=False)) is True  # any strides
    args = _decode_args()
    assert "int32" in sd(*args[:3], args[3].long(), *args[4:])  # block_tables
    assert "one query per sequence" in sd(args[0][:1], *args[1:])
    mixed = _decode_args()
    mixed[1] = mixed[1].to(torch.bfloat16)
    assert isinstance(sd(*mixed), str)
    q, kc, vc, bt, lens, scale = _decode_args()
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    assert sp(q, kc, vc, bt, cu, lens, scale) is True
    assert "cu_seqlens_q" in sp(q, kc, vc, bt, cu.long(), lens, scale)
    assert "cu_seqlens_q" in sp(q, kc, vc, bt, cu[:2], lens, scale)
    assert "device" in kmod.make_supports("cuda")[1](q, kc, vc, bt, cu, lens, scale)
    if CAPABILITY is None:  # bf16 needs sm_80 for its dots
        assert "capability" in kmod.make_supports("cpu", (7, 5))[0](*_decode_args(dtype=torch.bfloat16))


def test_registered_names_and_dispatch(registry):
    names = [(paged_attention_decode, "triton_paged_decode"), (paged_attention_prefill, "triton_paged_prefill")]
    for op, name in names:
        impl = next(i for i in registry.implementations(op) if i.name == name)
        assert impl.priority == kmod.PRIORITY
    # a declined call falls back to the reference
    args = _decode_args(device="meta") if DEVICE != "meta" else _decode_args()
    assert registry.select(paged_attention_decode, tuple(args)).name == "reference"
