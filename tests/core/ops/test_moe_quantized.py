"""The references of fused_moe_gguf and fused_moe_nvfp4 against fused_moe's on weights decoded independently (gguf-py
for the GGUF blocks, a table lookup for NVFP4), and their refusals of malformed calls."""

from __future__ import annotations

import gguf
import pytest
import torch

from engine.core.ops import OPS

MOE_REF = OPS["fused_moe"].reference
GGUF = OPS["fused_moe_gguf"]
NVFP4 = OPS["fused_moe_nvfp4"]
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _gguf_py(raw: torch.Tensor, qtype: int) -> torch.Tensor:
    e, rows, _ = raw.shape
    flat = gguf.quants.dequantize(raw.reshape(e * rows, -1).numpy(), gguf.GGMLQuantizationType(qtype))
    return torch.from_numpy(flat).float().reshape(e, rows, -1)


@pytest.mark.parametrize("case", GGUF.cases, ids=lambda c: c.name)
def test_gguf_reference_is_fused_moe_on_gguf_py_weights(case, gen):
    x, w13, t13, w2, t2, logits, top_k, renorm = GGUF.make_inputs(case.params, torch.float32, "cpu", gen)
    got = GGUF.reference(x, w13, t13, w2, t2, logits, top_k, renorm)
    want = MOE_REF(x, _gguf_py(w13, t13), _gguf_py(w2, t2), logits, top_k, renorm)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.abs().mean() > 0.01  # the inputs make a real output


def _table_decode(packed, block_scale, global_scale):
    codes = torch.stack((packed & 15, packed >> 4), -1).flatten(-2).long()
    return E2M1[codes] * block_scale.float().repeat_interleave(16, -1) / global_scale[..., None]


@pytest.mark.parametrize("case", NVFP4.cases, ids=lambda c: c.name)
def test_nvfp4_reference_is_fused_moe_on_table_decoded_weights(case, gen):
    x, p13, s13, g13, p2, s2, g2, logits, top_k, renorm = NVFP4.make_inputs(case.params, torch.float32, "cpu", gen)
    assert not torch.equal(g13[:, 0], g13[:, -1])  # gate and up carry their own global scales
    got = NVFP4.reference(x, p13, s13, g13, p2, s2, g2, logits, top_k, renorm)
    want = MOE_REF(x, _table_decode(p13, s13, g13), _table_decode(p2, s2, g2), logits, top_k, renorm)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_malformed_calls_are_refused_with_reasons(gen):
    args = list(GGUF.make_inputs(GGUF.cases[0].params, torch.float32, "cpu", gen))
    bad = args.copy()
    bad[4] = 12  # Q4_K for I = 96: not whole super-blocks
    with pytest.raises(ValueError, match="multiple of 256"):
        GGUF.reference(*bad)
    bad = args.copy()
    bad[6] = 9
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, 8\]"):
        GGUF.reference(*bad)
    nv = list(NVFP4.make_inputs(NVFP4.cases[0].params, torch.float32, "cpu", gen))
    bad = nv.copy()
    bad[5] = nv[5][:, :, :-1]
    with pytest.raises(ValueError, match="w2: packed, block_scale, global_scale must be"):
        NVFP4.reference(*bad)
