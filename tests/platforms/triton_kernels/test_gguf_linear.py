"""Triton GGUF kernels (platforms/triton_kernels/gguf_linear.py) against the op references: every qtype, every dtype
the module claims, the GEMV (M <= 4, with and without split-K) and the tensor-core path (M > 4), odd N; supports()
declining what the kernels do not take. Under the Triton interpreter on CPU when there is no GPU."""

from __future__ import annotations

import pytest
import torch

from engine.core.ops import KernelRegistry
from engine.core.ops.gguf_quant import (
    GGUF_QTYPES,
    Q4_0,
    Q4_1,
    Q8_0,
    _gguf_dequantize_ref,
    _gguf_linear_ref,
    _linear_inputs,
    gguf_dequantize,
    gguf_linear,
    random_gguf_weight,
)
from engine.platforms.triton_kernels import gguf_linear as kmod
from tests.platforms.triton_kernels.conftest import CAPABILITY, DEVICE, run_case

QTYPES = [Q4_0, Q4_1, Q8_0]
QNAME = {q: GGUF_QTYPES[q][0] for q in QTYPES}


@pytest.fixture(scope="module")
def registry() -> KernelRegistry:
    # Our own registry (the session one imports every kernel module, some of which are still being written).
    reg = KernelRegistry("triton")
    kmod.register(reg, DEVICE, CAPABILITY)
    return reg


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------------- dequantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
@pytest.mark.parametrize("rows,cols", [(1, 32), (7, 96), (19, 576)])
def test_dequantize_matches_reference(registry, qtype, rows, cols, dtype, seed):
    run_case(registry, "gguf_dequantize", "triton_gguf_dequantize", {"qtype": qtype, "rows": rows, "cols": cols},
             dtype, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
def test_dequantize_is_bit_exact(qtype, dtype, seed):
    """The contract: fp32 q*d (+m), no FMA, one rounding. Random weights hit plenty of bf16/fp16 rounding ties."""
    raw = random_gguf_weight(33, 1024, qtype, DEVICE, _gen(seed))
    got = kmod.dequantize(raw, qtype, 1024, dtype)
    want = _gguf_dequantize_ref(raw, qtype, 1024, dtype)
    assert got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    assert torch.equal(got.float().view(torch.int32), want.float().view(torch.int32))  # -0.0 vs 0.0 too


def test_dequantize_random_bytes(seed):
    """Arbitrary bytes (any fp16 scale, including subnormals, and every code), not only what gguf.quantize writes."""
    g = _gen(seed)
    for qtype in QTYPES:
        raw = torch.randint(0, 256, (5, 4 * GGUF_QTYPES[qtype][1]), generator=g, dtype=torch.uint8)
        blocks = raw.view(5, 4, -1)
        blocks[..., 1] &= 0xBF  # keep d (and m) finite: top exponent bit clear, so |d| < 2 (subnormals included)
        if qtype == Q4_1:
            blocks[..., 3] &= 0xBF
        raw = raw.to(DEVICE)
        for dtype in (torch.float32, torch.bfloat16):
            got = kmod.dequantize(raw, qtype, 128, dtype)
            assert torch.equal(got, _gguf_dequantize_ref(raw, qtype, 128, dtype)), (QNAME[qtype], dtype)


# ---------------------------------------------------------------------------------------------------- linear

LINEAR_SHAPES = [  # (m, n, k): decode rows, the GEMV's widest M, the first tensor-core M, a prefill; odd N
    (1, 48, 64),
    (3, 37, 576),
    (4, 64, 160),
    (5, 7, 96),
    (33, 96, 1536),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
@pytest.mark.parametrize("m,n,k", LINEAR_SHAPES, ids=lambda v: str(v))
def test_linear_matches_reference(registry, qtype, m, n, k, dtype, seed):
    run_case(registry, "gguf_linear", "triton_gguf_linear", {"qtype": qtype, "m": m, "n": n, "k": k}, dtype, seed)


@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
@pytest.mark.parametrize("m", [1, 4, 17])
def test_linear_fp16(qtype, m, seed):
    """fp16 x (claimed by supports, not in the op's tolerance table): the weight rounds to fp16 on the tensor-core
    path, so allow bf16-like error there."""
    x, raw, q, k = _linear_inputs({"qtype": qtype, "m": m, "n": 40, "k": 576}, torch.float16, DEVICE, _gen(seed))
    got = kmod.linear(x, raw, q, k)
    want = _gguf_linear_ref(x, raw, q, k)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=5e-3)


@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
def test_both_kernels_at_one_shape(qtype, seed):
    """The GEMV and the tensor-core kernel forced on the same inputs (M = 4: the boundary)."""
    x, raw, q, k = _linear_inputs({"qtype": qtype, "m": 4, "n": 24, "k": 256}, torch.float32, DEVICE, _gen(seed))
    want = _gguf_linear_ref(x, raw, q, k)
    for kernel in ("gemv", "dot"):
        torch.testing.assert_close(kmod.linear(x, raw, q, k, kernel=kernel), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
def test_gemv_split_k(qtype, seed):
    """Few rows of W and a long K: the GEMV splits K and sums fp32 partials; 1 to 4 rows of x."""
    n, k = 7, 2048
    _, splits, _ = kmod.gemv_plan(n, k // 32, kmod.sm_count(torch.device(DEVICE), kmod.INTERPRETER_SMS))
    assert splits > 1
    for m, dtype in ((1, torch.float32), (2, torch.bfloat16), (3, torch.float32), (4, torch.bfloat16)):
        x, raw, q, _ = _linear_inputs({"qtype": qtype, "m": m, "n": n, "k": k}, dtype, DEVICE, _gen(seed))
        tol = gguf_linear.tolerances[dtype]
        torch.testing.assert_close(kmod.linear(x, raw, q, k, kernel="gemv"), _gguf_linear_ref(x, raw, q, k),
                                   atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("qtype", QTYPES, ids=QNAME.get)
def test_dot_split_k(qtype, seed):
    """The tensor-core kernel over K in pieces (fp32 partials, one reduction): the default plan on few programs, and
    forced splits that leave a short last piece (K = 1,600: 50 blocks)."""
    n, k = 40, 1600
    for m, dtype, splits in ((9, torch.float32, None), (20, torch.bfloat16, None), (33, torch.bfloat16, 3),
                             (5, torch.float32, 7)):
        x, raw, q, _ = _linear_inputs({"qtype": qtype, "m": m, "n": n, "k": k}, dtype, DEVICE, _gen(seed))
        tol = gguf_linear.tolerances[dtype]
        cfg = None if splits is None else {"splits": splits}
        torch.testing.assert_close(kmod.linear(x, raw, q, k, kernel="dot", config=cfg),
                                   _gguf_linear_ref(x, raw, q, k), atol=tol.atol, rtol=tol.rtol)


def test_odd_storage_offset(seed):
    """Raw bytes viewed at an odd offset cannot be read as 16-bit words: copied, not misread."""
    x, raw, q, k = _linear_inputs({"qtype": Q4_0, "m": 1, "n": 5, "k": 64}, torch.float32, DEVICE, _gen(seed))
    storage = torch.empty(raw.numel() + 1, dtype=torch.uint8, device=DEVICE)
    shifted = storage[1:].view(raw.shape)
    shifted.copy_(raw)
    assert shifted.data_ptr() % 2
    for kernel in ("gemv", "dot"):
        torch.testing.assert_close(kmod.linear(x, shifted, q, k, kernel=kernel), _gguf_linear_ref(x, raw, q, k),
                                   atol=1e-4, rtol=1e-4)


def test_gemv_plan():
    # plenty of rows: no split; few rows: split until the SMs have work, never past one block group per split
    assert kmod.gemv_plan(4096, 448, 132, 8, 128) == (128, 2, 256)  # 512 programs of 8 rows: 2 splits -> 1024
    assert kmod.gemv_plan(14336, 128, 132, 8, 128)[1] == 1
    block_b, splits, per_split = kmod.gemv_plan(576, 18, 132, 8, 128)  # SmolLM2: 72 programs, K = 576
    assert splits == 1 and block_b == 32  # one step of 32 blocks already covers K: nothing to split
    block_b, splits, per_split = kmod.gemv_plan(576, 48, 132, 8, 128)  # K = 1536
    assert splits == 2 and per_split == 32 and block_b == 32
    block_b, splits, per_split = kmod.gemv_plan(8, 4096, 132, 8, 16)
    assert 132 <= splits <= 2 * 132 and per_split * splits >= 4096 and per_split % block_b == 0
    assert kmod.gemv_plan(8, 1, 132, 8, 16) == (1, 1, 1)
    assert kmod.gemv_plan(4096, 448, 132) == (64, 1, 448)  # the default 2-row tile: 2048 programs, no split


def test_linear_leading_dims_and_strides(seed):
    g = _gen(seed)
    raw = random_gguf_weight(12, 64, Q4_1, DEVICE, g, scale=0.125)
    x = torch.randn(2, 3, 128, generator=g)[..., ::2].to(DEVICE)  # [2, 3, 64], non-contiguous rows
    got = kmod.linear(x, raw, Q4_1, 64)
    assert got.shape == (2, 3, 12)
    torch.testing.assert_close(got, _gguf_linear_ref(x, raw, Q4_1, 64), atol=1e-4, rtol=1e-4)
    empty = kmod.linear(x[:, :0], raw, Q4_1, 64)
    assert empty.shape == (2, 0, 12)


def test_dispatch_picks_triton(registry, seed):
    x, raw, q, k = _linear_inputs({"qtype": Q8_0, "m": 1, "n": 16, "k": 64}, torch.float32, DEVICE, _gen(seed))
    assert registry.select(gguf_linear, (x, raw, q, k)).name == "triton_gguf_linear"
    assert registry.select(gguf_dequantize, (raw, q, k, torch.bfloat16)).name == "triton_gguf_dequantize"
    # declined -> the reference
    assert registry.select(gguf_linear, (x.double(), raw, q, k)).name == "reference"


# ---------------------------------------------------------------------------------------------------- supports


def test_supports_declines_with_reasons():
    lin = kmod.supports_linear(DEVICE)
    deq = kmod.supports_dequantize(DEVICE)
    raw = torch.zeros(4, 2 * 18, dtype=torch.uint8, device=DEVICE)  # Q4_0, 64 cols
    x = torch.zeros(2, 64, device=DEVICE)
    assert lin(x, raw, Q4_0, 64) is True
    assert deq(raw, Q4_0, 64, torch.float16) is True
    other = "meta" if DEVICE != "meta" else "cpu"
    cases = {
        "device": lin(x.to(other), raw, Q4_0, 64),
        "x dtype": lin(x.double(), raw, Q4_0, 64),
        "x int": lin(x.int(), raw, Q4_0, 64),
        "x cols": lin(torch.zeros(2, 32, device=DEVICE), raw, Q4_0, 64),
        "qtype": lin(x, raw, 12, 64),
        "raw shape": lin(x, raw, Q4_1, 64),
        "raw dtype": lin(x, raw.to(torch.int8), Q4_0, 64),
        "raw 1-D": lin(x, raw.reshape(-1), Q4_0, 64),
        "raw strided": lin(x, torch.zeros(4, 72, dtype=torch.uint8, device=DEVICE)[:, ::2], Q4_0, 64),
        "raw device": lin(x, raw.to(other), Q4_0, 64),
        "cols": lin(torch.zeros(2, 48, device=DEVICE), raw, Q4_0, 48),
        "out dtype": deq(raw, Q4_0, 64, torch.float64),
        "deq qtype": deq(raw, 6, 64, torch.float32),
    }
    for what, verdict in cases.items():
        assert isinstance(verdict, str) and verdict, (what, verdict)
    assert "qtype 12" in cases["qtype"]
    assert "float64" in cases["x dtype"]
