"""The engine end to end on an NVIDIA GPU through the cuda platform: greedy tokens equal HF transformers' on the
same random-weight model (fp32, 32 tokens) and the CPU engine's. Skipped without a CUDA device (CI has none);
run on the GPU machine with the rest of the suite."""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.cli_bench import KernelChoiceLog
from engine.core.ops.registry import active_registry
from engine.core.testing.random_model import write_random_llama

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (the cuda platform)")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("random_llama"), seed=int.from_bytes(os.urandom(4), "little"))


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    return [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (5, 17, 40, 1)]


def _engine_tokens(model_dir, platform, prompts):
    llm = LLM(str(model_dir), platform=platform, dtype="float32", num_kv_blocks=128, block_size=16)
    log = KernelChoiceLog.install(active_registry())
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    return llm, [o.outputs[0].token_ids for o in outs], log.by_op()


def test_greedy_tokens_equal_transformers_and_the_cpu_engine(model_dir, prompts):
    llm, gpu, used = _engine_tokens(model_dir, "cuda", prompts)
    assert llm.platform.name == "cuda" and llm.model.device.type == "cuda"
    for op in ("paged_attention_decode", "paged_attention_prefill", "rotary_write_kv", "rms_norm", "silu_and_mul",
               "linear"):
        assert used.get(op) and all(not name.startswith("core.") for name in used[op]), (op, used)
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    for p, ours in zip(prompts, gpu, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=NEW_TOKENS, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert ours == ref, f"prompt of {len(p)} tokens"
    _, cpu, _ = _engine_tokens(model_dir, "cpu", prompts)
    assert gpu == cpu


@pytest.mark.parametrize("qtype_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_a_gguf_model_runs_quantized_on_the_gpu_as_on_the_cpu(model_dir, prompts, tmp_path, qtype_name):
    """GGUF weights stay quantized on the GPU (the Triton GGUF linear dequantizes in the kernel)."""
    gguf = pytest.importorskip("gguf")
    from safetensors.torch import load_file

    from tests.core.loader.builders import byte_level_gguf_tokenizer, write_gguf

    cfg = transformers.LlamaConfig.from_pretrained(model_dir)
    tok = byte_level_gguf_tokenizer("smollm")
    cfg.vocab_size = len(tok["tokens"])
    state = {k: (v[: cfg.vocab_size] if "embed" in k or "lm_head" in k else v)
             for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    qtype = getattr(gguf.GGMLQuantizationType, qtype_name)
    path = write_gguf(tmp_path / "m.gguf", "llama", state, cfg, tokenizer=tok, qtype=lambda name, a: qtype)
    small = [[t % cfg.vocab_size for t in p] for p in prompts]
    gpu_llm, gpu, used = _engine_tokens(path, "cuda", small)
    assert any(name.startswith("cuda.") for name in used["gguf_linear"]), used
    _, cpu, _ = _engine_tokens(path, "cpu", small)
    assert gpu == cpu


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_async_scheduling_gives_the_synchronous_outputs(model_dir, prompts, enforce_eager):
    """On by default here (the cuda platform says it pays). Where both orders run the same batches (no stop on a
    token) everything is bit-identical: greedy and seeded tokens, n > 1, logprobs. A stop on a token makes the
    async order compute one discarded token, so the next step's batch differs in size; there the tokens and
    finish reasons are compared (the logprobs may differ in the last bits: the GEMMs are not batch-invariant)."""
    def run(mode, params, logprobs=True):
        llm = LLM(str(model_dir), platform="cuda", dtype="float32", num_kv_blocks=128, block_size=16,
                  max_num_batched_tokens=32, enforce_eager=enforce_eager, async_scheduling=mode)
        assert llm.engine.async_scheduling is (mode is not False)
        return [[(c.token_ids, c.finish_reason, c.stop_reason) + ((c.logprobs,) if logprobs else ()) for c in o.outputs]
                for o in llm.generate(prompts, params)]

    same_batches = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                    SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=16, logprobs=2, n=2, ignore_eos=True),
                    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1),
                    SamplingParams(temperature=0.7, seed=9, max_tokens=7, ignore_eos=True)]
    sync = run(False, same_batches)
    assert run(None, same_batches) == sync
    stops = [sync[0][0][0][5], sync[2][0][0][1]]
    stopping = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stops[0]]),
                SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stops[1]]),
                SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)]
    sync = run(False, stopping, logprobs=False)
    assert sync[0][0][1] == "stop" and sync[2][0][1] == "stop"
    assert run(True, stopping, logprobs=False) == sync
