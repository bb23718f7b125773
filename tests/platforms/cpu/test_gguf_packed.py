"""The row-interleaved GGUF layout (csrc/gguf_packed.h) and the packed Q8-activation linear: packing against the
documented layout and back, the packed linear against gguf_linear_q8act's reference (every qtype x dtype x ISA this
CPU runs x 1 and 2 threads, N around the 16-row group, K of 1..48 blocks, M = 1..64 around the tiles), the ISA gate,
the weight cache of the registered wrapper, and argument errors."""

import gc
import sys

import pytest
import torch

from engine.core.ops.gguf_q8act import gguf_linear_q8act
from engine.core.ops.gguf_quant import GGUF_QTYPES, Q4_0, Q4_1, Q8_0, gguf_dequantize, random_gguf_weight
from engine.platforms.cpu import _native
from engine.platforms.cpu.graph import capture
from engine.platforms.cpu.kernels import gguf as gguf_kernels

from .test_gguf_q8act import cpu_flags

QTYPES = (Q4_0, Q4_1, Q8_0)
IDS = ["q4_0", "q4_1", "q8_0"]
GROUP = 16
# (K, N): 1, 3 and 48 blocks; N below, at, just above and far from a multiple of the 16-row group.
SHAPES = [(32, 1), (96, 17), (576, 16), (576, 37), (1536, 13), (576, 1001)]


def pack(raw, qtype, k):
    n = raw.shape[0]
    out = torch.empty(_native.gguf_packed_bytes(qtype, n, k), dtype=torch.uint8)
    assert _native.gguf_pack(qtype, raw.data_ptr(), raw.stride(0), n, k, out.data_ptr()) == out.numel()
    return out


def layout_unpack(packed, qtype, n, k):
    """The raw rows from the packed bytes by the layout gguf_packed.h documents (torch views, not the C++): per group
    of 16 rows, block pairs of quants [2][C][16][4], scales [2][16] fp16 and, for Q4_1, minimums [2][16] fp16."""
    nb, chunks = k // 32, 8 if qtype == Q8_0 else 4
    pairs, parts = (nb + 1) // 2, 2 if qtype == Q4_1 else 1
    units = packed.view(-1, pairs, 2 * chunks * 64 + parts * 64)
    qs = units[..., :2 * chunks * 64].reshape(-1, pairs, 2, chunks, GROUP, 4).permute(0, 4, 1, 2, 3, 5)
    sc = units[..., 2 * chunks * 64:].reshape(-1, pairs, parts, 2, GROUP, 2).permute(0, 4, 1, 3, 2, 5)
    blocks = torch.cat([sc.reshape(-1, GROUP, 2 * pairs, 2 * parts), qs.reshape(-1, GROUP, 2 * pairs, 4 * chunks)], -1)
    return blocks[:, :, :nb].reshape(-1, nb * GGUF_QTYPES[qtype][1])[:n]


def call_packed(kernel: str, x, raw, qtype, k, packed):
    """y = x @ w^T through the native packed kernel ``_native.<kernel>`` on the packed copy ``packed``."""
    m, n = x.shape[0], raw.shape[0]
    y = torch.empty(m, n, dtype=x.dtype)
    getattr(_native, kernel)(qtype, x.data_ptr(), x.stride(0), m, k, raw.data_ptr(), raw.stride(0), n,
                             y.data_ptr(), n, gguf_kernels.DTYPE_CODE[x.dtype], packed.data_ptr())
    return y


def check_op(op, got, x, raw, qtype, k):
    """``got`` equals ``op``'s reference within its tolerance for x's dtype."""
    want = op.reference(x, raw, qtype, k)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = op.tolerances[x.dtype]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def packed_linear(x, raw, qtype, k, packed):
    return call_packed("gguf_linear_q8act_packed", x, raw, qtype, k, packed)


def check(got, x, raw, qtype, k):
    check_op(gguf_linear_q8act, got, x, raw, qtype, k)


@pytest.mark.parametrize("qtype", QTYPES, ids=IDS)
def test_pack_round_trip(qtype, gen):
    for k, n in SHAPES:
        raw = random_gguf_weight(n, k, qtype, "cpu", gen)
        packed = pack(raw, qtype, k)
        groups, nb = -(-n // GROUP), k // 32
        # The GGUF bytes, rows padded to the group and blocks to an even count.
        assert packed.numel() == groups * GROUP * (nb + nb % 2) * GGUF_QTYPES[qtype][1]
        assert torch.equal(layout_unpack(packed, qtype, n, k), raw)
        back = torch.zeros_like(raw)
        _native.gguf_unpack(qtype, packed.data_ptr(), n, k, back.data_ptr(), back.stride(0))
        assert torch.equal(back, raw)
        if n % GROUP:  # padding rows: zero quants and zero scales
            assert not layout_unpack(packed, qtype, groups * GROUP, k)[n:].any()
        if nb % 2:  # an odd block count's padding block
            assert not layout_unpack(packed, qtype, groups * GROUP, k + 32)[:, nb * GGUF_QTYPES[qtype][1]:].any()


def test_pack_strided_rows(gen):
    k, n = 96, 21
    raw = random_gguf_weight(n, k, Q4_1, "cpu", gen)
    wide = torch.cat([raw, raw[:, :7]], dim=1)[:, :raw.shape[1]]  # rows 7 bytes further apart
    assert torch.equal(layout_unpack(pack(wide, Q4_1, k), Q4_1, n, k), raw)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 33, 64, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qtype", QTYPES, ids=IDS)
def test_packed_matches_reference(qtype, dtype, m, isa, threads, gen):
    assert _native.gguf_packed_variant(), f"no packed kernel for {isa}"
    for k, n in SHAPES:
        raw = random_gguf_weight(n, k, qtype, "cpu", gen, scale=k ** -0.5)
        x = torch.randn(m, k, generator=gen).to(dtype)
        check(packed_linear(x, raw, qtype, k, pack(raw, qtype, k)), x, raw, qtype, k)


@pytest.mark.parametrize("qtype", QTYPES, ids=IDS)
def test_extreme_blocks(qtype, isa, gen):
    # Zero blocks (d = 0), one huge value per block, exact .5 ties, blocks of equal magnitudes; weights at the
    # ends of their ranges (Q8_0 -128 and 127, nibbles 0 and 15: the u8 x s8 products and Q8_0's 128 offset).
    k, n = 256, 19
    raw = random_gguf_weight(n, k, qtype, "cpu", gen, scale=0.1)
    bb, off = GGUF_QTYPES[qtype][1], 4 if qtype == Q4_1 else 2
    blocks = raw.view(n, k // 32, bb)
    blocks[0, :, off:] = 0x80 if qtype == Q8_0 else 0x00
    blocks[1, :, off:] = 0x7F if qtype == Q8_0 else 0xFF
    x = torch.randn(4, k, generator=gen)
    x[0, :64] = 0
    x[1, ::32] = 1e4
    x[2] = torch.arange(k, dtype=torch.float32).remainder(64).sub(31.5) * (127 / 31.5) / 127
    x[3] = torch.where(torch.rand(k, generator=gen) < 0.5, -3.0, 3.0)
    got = packed_linear(x, raw, qtype, k, pack(raw, qtype, k))
    want = gguf_linear_q8act.reference(x, raw, qtype, k)
    # As test_gguf_q8act.py: the 1e4 row's block products cancel, bound the error by the sum of |terms|.
    w = gguf_dequantize.reference(raw, qtype, k, torch.float32)
    terms = x.abs() @ w.abs().t()
    tol = gguf_linear_q8act.tolerances[x.dtype]
    assert ((got - want).abs() <= tol.atol + tol.rtol * want.abs() + 1e-6 * terms).all(), (got - want).abs().max()


def test_gate_follows_isa(isa):
    flags = cpu_flags()
    # x86 and the portable ISA have packed kernels (AVX-512 without VNNI: the AVX2 one); NEON, VSX, RVV do not.
    want = {"avx512": "avx512_vnni" if "avx512_vnni" in flags else "avx2", "avx2": "avx2", "scalar": "scalar"}
    assert _native.gguf_packed_variant() == want.get(isa, "")


def test_registered_wrapper_packs_once_and_follows_the_gate(isa, registry, gen, monkeypatch):
    (impl,) = [i for i in registry.implementations(gguf_linear_q8act) if i.name == "native"]
    k, n = 96, 40
    raw = random_gguf_weight(n, k, Q4_1, "cpu", gen, scale=k ** -0.5)
    x = torch.randn(3, k, generator=gen)
    check(impl.fn(x, raw, Q4_1, k), x, raw, Q4_1, k)
    entry = gguf_kernels._PACKED[id(raw)]
    assert (entry[3] is not None) == bool(_native.gguf_packed_variant())
    check(impl.fn(x[:1], raw, Q4_1, k), x[:1], raw, Q4_1, k)
    for m in (gguf_kernels.Q8ACT_MAX_M + 1, gguf_kernels.PACKED_MAX_M + 1):  # packed, then torch quantize + GEMM
        xm = torch.randn(m, k, generator=gen)
        check(impl.fn(xm, raw, Q4_1, k), xm, raw, Q4_1, k)
    assert gguf_kernels._PACKED[id(raw)] is entry  # no second copy

    raw[:, 4:] = raw[:, 4:].flip(0)  # in place: the version counter moves, the copy is remade
    check(impl.fn(x, raw, Q4_1, k), x, raw, Q4_1, k)
    assert gguf_kernels._PACKED[id(raw)] is not entry

    key = id(raw)
    del raw, entry
    gc.collect()
    assert key not in gguf_kernels._PACKED  # the copy goes with the raw tensor

    # Where the ISA has no packed kernel (NEON, VSX, RVV; none on this host), nothing is packed and the raw-row
    # kernel runs: the gate's answer stood in for here, the kernels run for real.
    monkeypatch.setattr(_native, "gguf_packed_variant", lambda: "")
    raw = random_gguf_weight(n, k, Q4_0, "cpu", gen, scale=k ** -0.5)
    check(impl.fn(x, raw, Q4_0, k), x, raw, Q4_0, k)
    assert gguf_kernels._PACKED[id(raw)][3] is None


def test_inference_tensors_and_cpu_graphs(registry, gen):
    # Weights made under inference mode keep no version counter; a CPU graph records the packed call (the packing,
    # which returns a value, is not replayed) and replays it on new x.
    (impl,) = [i for i in registry.implementations(gguf_linear_q8act) if i.name == "native"]
    k, n = 576, 40
    with torch.inference_mode():
        raw = random_gguf_weight(n, k, Q4_0, "cpu", gen, scale=k ** -0.5)
        x = torch.randn(2, k, generator=gen)
        replay, out = capture(lambda: impl.fn(x, raw, Q4_0, k))
        assert replay.num_calls == 1
        for _ in range(2):
            x.copy_(torch.randn(2, k, generator=gen))
            replay()
            check(out, x, raw, Q4_0, k)


def test_copies_live_in_huge_page_arenas(registry, gen):
    (impl,) = [i for i in registry.implementations(gguf_linear_q8act) if i.name == "native"]
    big = torch.empty(8 << 20, dtype=torch.uint8)
    advised = _native.gguf_advise_huge_pages(big.data_ptr(), big.numel())
    if sys.platform.startswith("linux"):  # the 2 MB pages inside the range
        assert advised % (2 << 20) == 0 and (6 << 20) <= advised <= (8 << 20)
    raws = [random_gguf_weight(n, 64, Q8_0, "cpu", gen) for n in (5, 40)]
    x = torch.randn(2, 64, generator=gen)
    for raw in raws:
        check(impl.fn(x, raw, Q8_0, 64), x, raw, Q8_0, 64)
    copies = [gguf_kernels._PACKED[id(raw)][3] for raw in raws]
    assert all(c.data_ptr() % 64 == 0 and c.numel() == _native.gguf_packed_bytes(Q8_0, r.shape[0], 64)
               for c, r in zip(copies, raws, strict=True))
    assert all(c.untyped_storage().nbytes() >= gguf_kernels._ARENA_BYTES for c in copies)  # views of an arena


def test_argument_errors():
    raw, packed = torch.zeros(1, 40, dtype=torch.uint8), torch.zeros(GROUP * 40, dtype=torch.uint8)
    good = dict(qtype=Q4_1, w=raw.data_ptr(), w_stride=40, n=1, k=64, out=packed.data_ptr())
    _native.gguf_pack(**good)
    for bad in (dict(qtype=6), dict(k=48), dict(w_stride=39), dict(n=-1)):
        with pytest.raises(ValueError, match="qtype|multiple of 32|w_stride"):
            _native.gguf_pack(**{**good, **bad})
    x, y = torch.zeros(64), torch.zeros(1)
    args = dict(qtype=Q4_1, x=x.data_ptr(), x_stride=64, m=1, k=64, w=raw.data_ptr(), w_stride=40, n=1,
                y=y.data_ptr(), y_stride=1, dtype=_native.DTYPE_F32, packed=packed.data_ptr())
    _native.gguf_linear_q8act_packed(**args)
    for bad in (dict(qtype=6), dict(k=48), dict(x_stride=32), dict(dtype=7), dict(packed=0)):
        with pytest.raises(ValueError, match="qtype|multiple of 32|stride|dtype|null"):
            _native.gguf_linear_q8act_packed(**{**args, **bad})
