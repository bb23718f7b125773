"""``engine generate`` as a user runs it: arguments, stdin, a prompts file, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.plugin_helpers import REPO, run_engine


@pytest.mark.usefixtures("default_model")
def test_generate_answers_a_question_with_the_default_model():
    proc = run_engine(["generate", "--temperature", "0", "--max-tokens", "12", "What is the capital of France?"])
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


@pytest.mark.usefixtures("default_model")
def test_prompts_from_stdin_and_from_a_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_PLATFORM"}
    greedy = ["generate", "--temperature", "0", "--max-tokens", "8"]
    proc = subprocess.run([sys.executable, "-m", "engine.core.cli", *greedy],
                          input="What is the capital of France?\n", capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    f = tmp_path / "prompts.txt"
    f.write_text("What is the capital of France?\n\nName a color.\n")
    proc = run_engine(["generate", "--temperature", "0", "--max-tokens", "8", "--file", str(f)])
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split("=== [1] Name a color.\n")
    assert first.startswith("=== [0] What is the capital of France?\n") and "Paris" in first
    assert second.strip(), "the second prompt got no answer"


@pytest.mark.usefixtures("default_model")
def test_chat_template_replaces_the_models_own(tmp_path):
    """--chat-template, a file or the template's text: this one ignores the user's words and asks its own question,
    so the answer shows which template ran."""
    own = ("<|im_start|>user\nWhat is the capital of {{ messages[-1].content }}?<|im_end|>\n"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    f = tmp_path / "chat.jinja"
    f.write_text(own)
    for template in (str(f), own):
        proc = run_engine(["generate", "--temperature", "0", "--max-tokens", "8", "--chat-template", template,
                           "France"])
        assert proc.returncode == 0, proc.stderr
        assert "Paris" in proc.stdout
    _one_clear_line(["generate", "--chat-template", "{% for %}", "hi"], "the template does not parse")
    _one_clear_line(["generate", "--chat-template", "/nope/chat.jinja", "hi"], "neither a file nor a Jinja template")


def _one_clear_line(args: list[str], message: str) -> None:
    proc = run_engine(args)
    assert proc.returncode == 2, (args, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_errors_are_one_clear_line():
    _one_clear_line(["generate", "--model", "/nope/model.gguf", "hi"], "/nope/model.gguf")
    _one_clear_line(["generate", "--temperature", "-1", "hi"], "temperature must be >= 0")
    _one_clear_line(["generate", "--platform", "cpux", "hi"], "Did you mean 'cpu'")


@pytest.mark.usefixtures("default_model")
def test_prompt_longer_than_the_context_is_one_clear_line():
    _one_clear_line(["generate", "--no-chat", "word " * 9000], "but the context holds 8192")


def test_a_bad_speculative_config_is_one_clear_line():
    _one_clear_line(["generate", "--speculative-config", "{method}", "hi"], "not JSON")
    _one_clear_line(["generate", "--speculative-config", '{"method": "ngrm"}', "hi"], "method must be one of")
    _one_clear_line(["generate", "--speculative-config", '{"num_speculative_tokens": -1}', "hi"],
                    "num_speculative_tokens")
    _one_clear_line(["generate", "--speculative-config", '{"lookahead": 4}', "hi"], "unknown keys ['lookahead']")


@pytest.mark.usefixtures("default_model")
def test_speculative_config_drafts_and_keeps_the_greedy_tokens():
    from engine.core.cli import build_parser
    from engine.core.cli_generate import load_llm
    from engine.core.engine.sampling_params import SamplingParams

    spec = '{"method": "ngram", "num_speculative_tokens_per_batch_size": {"1": 4, "8": 0}, "prompt_lookup_min": 2}'
    args = build_parser().parse_args(["generate", "--speculative-config", spec, "x"])
    llm = load_llm(args)
    assert llm.engine.speculator.config.num_tokens_for(1) == 4 and llm.engine.speculator.config.num_tokens_for(9) == 0
    prompt = "Repeat after me: one two three four five six seven eight. one two three four five six seven eight."
    params = SamplingParams(temperature=0, max_tokens=24)
    drafted = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert llm.engine.speculator.stats.totals()["drafted"] > 0  # it speculated
    plain = load_llm(build_parser().parse_args(["generate", "x"]))
    assert plain.engine.speculator is None
    assert plain.generate([prompt], params)[0].outputs[0].token_ids == drafted


@pytest.mark.usefixtures("default_model")
def test_tensor_parallel_size_from_the_command_line():
    """--tensor-parallel-size 2 through the CLI's own loader: two ranks, the same greedy tokens; sizes the model
    cannot take are one clear line."""
    from engine.core.cli import build_parser
    from engine.core.cli_generate import load_llm
    from engine.core.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12)
    llm = load_llm(build_parser().parse_args(["generate", "--tensor-parallel-size", "2", "x"]))
    try:
        assert llm.tensor_parallel_size == 2 and len(llm.model.workers) == 1
        tp = llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids
    finally:
        llm.close()
    plain = load_llm(build_parser().parse_args(["generate", "x"]))
    assert plain.generate(["The capital of France is"], params)[0].outputs[0].token_ids == tp
    _one_clear_line(["generate", "--tensor-parallel-size", "5", "hi"], "more than the model's 3 KV heads")
    _one_clear_line(["generate", "--tensor-parallel-size", "0", "hi"], "tensor_parallel_size must be an int >= 1")
