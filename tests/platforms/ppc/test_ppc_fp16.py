"""fp16 on the ppc platform, exercised on any host: PpcPlatform is built directly (its probe would refuse a
non-POWER machine) and its registrations run on the native module of this host, whose kernels are the same C++
source as the VSX build. fp16 is a supported dtype; every op of a dense fp16 model dispatches to a ppc kernel (the
fp16 dense linear at every row count); the engine's greedy tokens match the all-reference path."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core import plugins
from engine.core.cli_bench import KernelChoiceLog
from engine.core.ops import registry as reg_mod
from engine.core.ops.linear import linear
from engine.core.ops.norm import rms_norm
from engine.core.ops.registry import active_registry
from engine.core.testing.conformance import HOST_BUDGET, fresh_seed
from engine.core.testing.coverage import collect_coverage, run_coverage
from engine.core.testing.random_model import write_random_llama
from engine.platforms.cpu import _native
from engine.platforms.cpu.platform import CpuPlatform
from engine.platforms.ppc.platform import PpcPlatform

NEW_TOKENS = 16
VECTOR_ISA = _native.isa() != "scalar"  # ppc takes the native fp16 linear on a vector ISA only (kernels/linear.py)


class ReferencePlatform(CpuPlatform):
    """The cpu platform with no kernels: every op runs its plain-torch reference (the specification)."""

    name = "reference"

    def register_kernels(self, registry) -> None:
        pass


def test_fp16_is_supported_and_said_so():
    ppc = PpcPlatform()
    assert torch.float16 in ppc.supported_dtypes() and torch.float16 not in CpuPlatform().supported_dtypes()
    assert "fp16 as a supported dtype" in ppc.description and "not a supported dtype" not in ppc.description
    assert "fp16 dense linear" in ppc.facts()["vsx_kernels"]


@pytest.mark.skipif(not VECTOR_ISA, reason="the scalar ISA: ppc leaves fp16 linear to torch there")
def test_registrations_route_fp16_to_the_native_kernels(caplog):
    reg = plugins.build_registry(PpcPlatform())
    assert reg.platform == "ppc" and [i.name for i in reg.implementations(linear)] == ["native_fp16", "torch_blas"]
    with caplog.at_level(logging.WARNING, logger="engine"):
        for m in (1, 4, 300):  # every M, unlike the cpu platform on a CPU with AVX512-FP16
            x, w = torch.randn(m, 48).half(), torch.randn(40, 48).half()
            assert reg.select(linear, (x, w, None)).qualname == "ppc.native_fp16"
        assert reg.select(linear, (x.float(), w.float(), None)).qualname == "ppc.torch_blas"
        assert reg.select(rms_norm, (x, torch.ones(48).half(), 1e-6)).qualname == "ppc.native"
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_every_kernel_accepts_the_dtypes_it_claims_there():
    """The conformance kit's coverage check, as the ppc64le CI row runs it (--engine-platform=ppc): with fp16 among
    the platform's dtypes, each kernel claiming it (every one registered without a dtypes=...) accepts an fp16 case."""
    ppc = PpcPlatform()
    covs = collect_coverage(plugins.build_registry(ppc), ppc.supported_dtypes())
    claim_fp16 = {c.op.name for c in covs if c.dtype == torch.float16 and c.impls}
    assert {"linear", "rms_norm", "paged_attention_decode", "silu_and_mul", "rotary_embedding"} <= claim_fp16
    seed = fresh_seed()
    for cov in covs:
        run_coverage(cov, torch.device("cpu"), seed, HOST_BUDGET)


@pytest.fixture(scope="module", autouse=True)
def _restore_active_platform():
    """These tests activate ppc and a kernel-less platform; later tests in the process get back what was active."""
    before, state = reg_mod._ACTIVE, dict(plugins._STATE)
    yield
    reg_mod.set_active_registry(before)
    plugins._STATE.clear()
    plugins._STATE.update(state)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("fp16_llama"), dtype=torch.float16, num_layers=2,
                              seed=int.from_bytes(os.urandom(4), "little"))


def _run(model_dir, platform, prompts):
    llm = LLM(str(model_dir), platform=platform, dtype="float16", num_kv_blocks=64, block_size=16)
    log = KernelChoiceLog.install(active_registry())
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    return llm, [o.outputs[0].token_ids for o in outs], log.by_op()


@pytest.mark.skipif(not VECTOR_ISA, reason="the scalar ISA: ppc leaves fp16 linear to torch there")
def test_greedy_tokens_equal_the_reference_path(model_dir, caplog):
    """Both paths compute in fp32 and round to fp16 at different points, so a step whose two best logits are within
    an fp16 rounding of each other may go either way; a divergence must be such a tie, checked on the logits of the
    shared prefix, with the paths' logits close everywhere."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (5, 17, 40, 1)]
    with caplog.at_level(logging.WARNING, logger="engine"):
        ppc, ours, used = _run(model_dir, PpcPlatform(), prompts)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    for op in ("linear", "rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_write_kv",
               "paged_attention_prefill", "paged_attention_decode"):
        assert used.get(op) == [f"ppc.native{'_fp16' if op == 'linear' else ''}"], (op, used)
    ref, theirs, _ = _run(model_dir, ReferencePlatform(), prompts)
    for p, a, b in zip(prompts, ours, theirs, strict=True):
        ids = p + a[:NEW_TOKENS - 1]
        plugins.activate(ppc.platform)
        la = ppc.prompt_logits(ids).float()
        plugins.activate(ref.platform)
        lb = ref.prompt_logits(ids).float()
        torch.testing.assert_close(la, lb, atol=0.05, rtol=0.01)
        if a == b:
            continue
        j = next(i for i in range(NEW_TOKENS) if a[i] != b[i])
        row = len(p) + j - 1  # the logits that chose token j
        ulp = 2.0 ** (torch.floor(torch.log2(la[row].abs().max())) - 10)  # one fp16 step at the top logits
        for lg, mine, other in ((la, a[j], b[j]), (lb, b[j], a[j])):
            assert lg[row, mine] - lg[row, other] <= 2 * ulp, (f"prompt of {len(p)} tokens, step {j}: not a tie",
                                                               lg[row, mine].item(), lg[row, other].item())
