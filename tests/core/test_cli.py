"""The ``engine`` command line behaves: Ctrl-C exits 130 quietly during load and generation, a closed pipe ends it
quietly, user errors are one line with exit status 2, ``--version``, ``--help`` with defaults, and the sampling
defaults are SamplingParams' own."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import time

import pytest

from engine.core import cli
from engine.core.cli_generate import NO_PROMPT
from engine.core.engine.sampling_params import SamplingParams
from tests.plugin_helpers import REPO

GENERATE = [sys.executable, "-m", "engine.core.cli", "generate", "--no-chat", "--temperature", "0",
            "--max-tokens", "4000", "Once upon a time"]


def _env():
    return {k: v for k, v in os.environ.items() if k not in ("ENGINE_PLATFORM", "ENGINE_DEBUG")}


def _interrupt(after_output: bool) -> tuple[int, str, bytes]:
    p = subprocess.Popen(GENERATE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=_env())
    try:
        if after_output:
            first = p.stdout.read(8)  # generation has started
        else:
            _wait_for_model_mapping(p)
            first = b""
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, err.decode(), first + out


def _wait_for_model_mapping(p: subprocess.Popen) -> None:
    """Return once the process has mapped the GGUF file (loading the model), or after 0.5 s where /proc is absent."""
    maps = f"/proc/{p.pid}/maps"
    if not os.path.exists(maps):
        time.sleep(0.5)
        return
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        with open(maps) as f:
            if ".gguf" in f.read():
                return
        time.sleep(0.005)
    raise AssertionError("the model file was never mapped")


@pytest.mark.usefixtures("default_model")
@pytest.mark.parametrize("after_output", [False, True], ids=["during-load", "during-generation"])
def test_ctrl_c_exits_130_without_a_traceback(after_output):
    rc, err, out = _interrupt(after_output)
    assert rc == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert bool(out) == after_output, out[:200]


@pytest.mark.usefixtures("default_model")
def test_output_piped_into_head_ends_quietly():
    cmd = " ".join(f"'{a}'" for a in GENERATE) + ' | head -c 16; echo "status=${PIPESTATUS[0]}" >&2'
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    assert len(proc.stdout) == 16
    assert proc.stderr.strip() == f"status={cli.BROKEN_PIPE}", proc.stderr


def test_version_and_help_show_defaults(capsys):
    from engine import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"engine {__version__}"
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    d = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    assert f"(default: {d['max_tokens']})" in text
    for opt in ("temperature", "top_p", "repetition_penalty"):
        assert f"--{opt.replace('_', '-')}" in text and f"else {d[opt]})" in text and "the model's" in text
    assert "(default: None)" not in text and "chat template" in text


def test_cli_sampling_options_left_out_take_the_models_defaults():
    """Sampling options not given are the model's (LLM.get_default_sampling_params), given ones override them."""
    from engine.core.cli_generate import MODEL_DEFAULTED, sampling_options

    args = cli.build_parser().parse_args(["generate", "x"])
    assert all(getattr(args, k) is None for k in MODEL_DEFAULTED)
    opts = sampling_options(args)
    assert not set(MODEL_DEFAULTED) & set(opts)
    d = SamplingParams()
    assert (opts["max_tokens"], opts["seed"], opts["presence_penalty"], opts["frequency_penalty"]) == (
        d.max_tokens, d.seed, d.presence_penalty, d.frequency_penalty)
    args = cli.build_parser().parse_args(["generate", "x", "--temperature", "0", "--repetition-penalty", "1.3"])
    opts = sampling_options(args)
    assert opts["temperature"] == 0.0 and opts["repetition_penalty"] == 1.3 and "top_p" not in opts


@pytest.mark.parametrize("argv, message", [
    (["generate", "--dtype", "float64", "hi"], "invalid choice: 'float64'"),
    (["generate", "--max-tokens", "many", "hi"], "invalid int value: 'many'"),
    (["generate", "--no-such-option", "hi"], "unrecognized arguments: --no-such-option"),
])
def test_bad_options_are_one_line_and_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == cli.USER_ERROR and len(err) == 1 and message in err[0], err


def test_empty_prompt_argument_and_empty_stdin_agree(monkeypatch, capsys):
    seen = []
    for argv, stdin in ((["generate", ""], "unused"), (["generate", "  "], "unused"), (["generate"], ""),
                        (["generate", "-"], "\n")):
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        assert cli.main(argv) == cli.USER_ERROR
        seen.append(capsys.readouterr().err.strip())
    assert seen == [f"engine generate: error: {NO_PROMPT}"] * 4, seen


def test_dtype_the_platform_has_no_kernels_for_is_refused(capsys):
    # cpu named: a GPU machine's default platform has float16 kernels
    assert cli.main(["generate", "--platform", "cpu", "--dtype", "float16", "hi"]) == cli.USER_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "float16" in err[0] and "plain-torch reference" in err[0], err


@pytest.mark.usefixtures("default_model")
def test_default_sampling_gives_sensible_answers():
    """The defaults a call without SamplingParams uses (LLM.get_default_sampling_params, which the CLI uses too)
    answer the default model's easy prompts and end on their own, without loops: the haiku prompt that loops forever
    greedily on some CPUs stops, and the capital is Paris (at SamplingParams() alone, "L'Étoile, la femme, la femme,
    ..." on some seeds)."""
    import dataclasses

    from benchmarks.sampling_loops import is_loop
    from engine import LLM

    llm = LLM(platform="cpu")
    seeds = range(6)
    questions = ("Write a haiku about the sea.", "What is the capital of France?")
    convs = [[{"role": "user", "content": q}] for q in questions]
    base = llm.get_default_sampling_params()
    params = [dataclasses.replace(base, seed=s, max_tokens=160) for s in seeds for _ in convs]
    outs = [o.outputs[0] for o in llm.chat([c for _ in seeds for c in convs], params)]
    haikus, capitals = outs[0::2], outs[1::2]
    assert not [o.text for o in outs if is_loop(o.text)]
    assert sum(o.finish_reason == "stop" for o in haikus) >= len(seeds) - 1, [o.text for o in haikus]
    # The model itself hesitates on the first token ("The" vs "L'..."): most answers, not all, name Paris.
    assert sum("Paris" in o.text for o in capitals) > len(seeds) // 2, [o.text for o in capitals]


_GC_PROBE = """
import gc, sys
from engine.core import cli, plugins
seen, activate = [], plugins.activate
plugins.activate = lambda *a, **k: seen.append(gc.isenabled()) or activate(*a, **k)
frozen = gc.get_freeze_count()
sys.argv = ["engine", "generate", "--max-tokens", "1", "--no-chat", "Hi"]
rc = cli.main()
print("RESULT", rc, seen[0], gc.isenabled(), gc.get_freeze_count() > frozen, file=sys.stderr)
"""


@pytest.mark.usefixtures("default_model")
def test_command_line_start_up_runs_without_the_collector_and_resumes_it():
    """A command-line run loads with the collector off, then freezes what start-up left and turns it back on;
    an in-process call (argv given) leaves the caller's collector alone."""
    proc = subprocess.run([sys.executable, "-c", _GC_PROBE], capture_output=True, text=True, cwd=REPO, env=_env(),
                          timeout=300)
    assert "RESULT 0 False True True" in proc.stderr, proc.stderr[-2000:]
    import gc

    frozen = gc.get_freeze_count()
    assert cli.main(["doctor", "--json"]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen
