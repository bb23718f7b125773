"""The LLM API on the built-in SmolLM2: stop strings, streaming, seeds, limits and bad input."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.loader import ModelLoadError
from engine.core.plugins import PlatformError

PROMPT = "Write one sentence about the ocean."


@pytest.fixture(scope="module")
def llm(default_model):
    return LLM(kv_cache_bytes=64 << 20)


@pytest.fixture(scope="module")
def free_text(llm):
    out = llm.chat([{"role": "user", "content": PROMPT}], SamplingParams(temperature=0, max_tokens=24))[0].outputs[0]
    assert len(out.text) > 30, out.text
    return out.text


def test_stop_string_cuts_text_and_is_never_streamed(llm, free_text):
    words = free_text.split()
    stop = " " + words[len(words) // 2]  # a string that first appears mid-answer
    cut = free_text.index(stop)
    params = SamplingParams(temperature=0, max_tokens=24, stop=[stop])
    prompt = llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": PROMPT}]), add_special_tokens=False)
    deltas, final = [], None
    for u in llm.stream(prompt, params):
        deltas.append(u.delta_text)
        final = u.output.outputs[0] if u.finished else final
    assert final.finish_reason == "stop"
    assert final.text == free_text[:cut]
    assert "".join(deltas) == final.text
    assert all(stop not in d for d in deltas)


def test_streamed_deltas_add_up_to_the_text(llm, free_text):
    prompt = llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": PROMPT}]), add_special_tokens=False)
    deltas = [u.delta_text for u in llm.stream(prompt, SamplingParams(temperature=0, max_tokens=24))]
    assert "".join(deltas) == free_text


def test_seeded_sampling_is_reproducible_in_any_batch(llm):
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=10, ignore_eos=True)
    alone = llm.generate("The weather today is", sp)[0].outputs[0].token_ids
    batched = llm.generate(["Tell me about cats.", "The weather today is", "1, 2, 3,"],
                           [SamplingParams(temperature=1.0, max_tokens=7), sp,
                            SamplingParams(temperature=0, max_tokens=6)])
    assert batched[1].outputs[0].token_ids == alone


def test_max_tokens_ends_with_length(llm):
    out = llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


@pytest.mark.usefixtures("default_model")
def test_prompt_longer_than_the_context_is_refused(tmp_path):
    llm = LLM(max_model_len=32, num_kv_blocks=8)
    with pytest.raises(ValueError, match=r"prompt has \d+ tokens but the context holds 32"):
        llm.generate("word " * 40)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-5), dict(max_tokens=0),
                                 dict(min_p=2.0), dict(seed=2**64), dict(seed=-(2**63) - 1),
                                 dict(seed=2**64 - 1, n=2)])
def test_invalid_sampling_params(bad):
    with pytest.raises(ValueError, match="invalid SamplingParams"):
        SamplingParams(**bad)


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), 0])
def test_every_accepted_seed_makes_a_generator(seed):
    """The bounds SamplingParams accepts are exactly what torch.Generator takes (the sampler seeds one per request)."""
    import torch

    torch.Generator().manual_seed(SamplingParams(seed=seed).seed)


def test_unknown_model_path_and_platform():
    with pytest.raises(ModelLoadError, match="no-such-model.gguf"):
        LLM("/nonexistent/no-such-model.gguf")
    with pytest.raises(PlatformError, match="Did you mean 'cpu'"):
        LLM(platform="cpux")


def test_activation_quant_choices(monkeypatch):
    from engine.core.engine import llm as llm_module
    from engine.core.ops import KernelRegistry

    with pytest.raises(ValueError, match=r"activation_quant must be one of \('auto', 'q8', 'none'\)"):
        llm_module.resolve_activation_quant("int8")
    assert llm_module.resolve_activation_quant("none") == "none"
    assert llm_module.resolve_activation_quant("q8") == "q8"
    # auto: q8 exactly where the active platform registered a kernel for gguf_linear_q8act.
    monkeypatch.setattr(llm_module, "active_registry", lambda: KernelRegistry("bare"))
    assert llm_module.resolve_activation_quant("auto") == "none"
    with_kernel = KernelRegistry("cpu")
    with_kernel.register("gguf_linear_q8act", lambda *a: None, name="k")
    monkeypatch.setattr(llm_module, "active_registry", lambda: with_kernel)
    assert llm_module.resolve_activation_quant("auto") == "q8"


def test_the_ending_token_is_not_text_even_with_special_tokens_kept(llm, free_text):
    """EOS ends the answer but is not part of it (vLLM's rule): keeping special tokens must not append
    '<|im_end|>'; with ignore_eos it is an ordinary token and is text."""
    kept = llm.chat([{"role": "user", "content": PROMPT}],
                    SamplingParams(temperature=0, max_tokens=200, skip_special_tokens=False))[0].outputs[0]
    assert kept.finish_reason == "stop" and kept.stop_reason is None
    assert kept.token_ids[-1] in llm.tokenizer.eos_token_ids
    assert kept.text.startswith(free_text) and "<|im_end|>" not in kept.text
    eos = kept.token_ids[-1]
    prompt = llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": PROMPT}]), add_special_tokens=False)
    n = len(kept.token_ids)
    past = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                                 skip_special_tokens=False))[0].outputs[0]
    assert past.token_ids[:n] == kept.token_ids and past.token_ids[n - 1] == eos
    assert past.text == kept.text + llm.tokenizer.decode([eos], skip_special_tokens=False)
