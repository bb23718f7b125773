"""``engine serve`` as a user starts it: a subprocess on a free port, called with the openai client."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests import needs
from tests.core.serving import real_chat_templates
from tests.core.serving.live_server import free_port
from tests.plugin_helpers import REPO

openai = needs.module("openai")


def _serve(*args: str) -> tuple[int, subprocess.Popen]:
    """``engine serve`` on a free port, started as a user would, once /health answers 200."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "engine.core.cli", "serve", "--port", str(port), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"engine serve did not come up: {proc.communicate()[1]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return port, proc
        except httpx.HTTPError:
            time.sleep(0.2)


@pytest.mark.usefixtures("default_model")
def test_serve_answers_and_stops():
    port, proc = _serve("--max-model-len", "256", "--served-model-name", "tiny", "--log-level", "warning")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        question = [{"role": "user", "content": "What is the capital of France?"}]
        with pytest.raises(openai.BadRequestError, match="context of 256"):  # --max-model-len is the context
            client.chat.completions.create(model="tiny", messages=question, max_tokens=300)
        r = client.chat.completions.create(model="tiny", messages=question, temperature=0, max_tokens=16)
        assert "Paris" in r.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, proc.stderr  # SIGTERM: a graceful shutdown, exit 0



def test_a_port_in_use_is_one_line_and_exit_2_before_loading_anything():
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "engine.core.cli", "serve", "--port", str(port)], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert proc.returncode == 2, proc.stderr
    assert "serving" not in proc.stdout and "http://" not in proc.stdout, proc.stdout  # never claimed to serve
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0], proc.stderr
    assert time.monotonic() - start < 60  # refused before the model was loaded


@pytest.mark.usefixtures("default_model")
def test_sigint_ends_a_stream_with_a_final_chunk_and_exits_0_without_a_traceback():
    import json
    import signal

    port, proc = _serve("--max-model-len", "512", "--served-model-name", "tiny")
    try:
        body = {"model": "tiny", "prompt": "Write a very long story.", "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        lines, signalled = [], None
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data: {") and signalled is None:
                    proc.send_signal(signal.SIGINT)
                    signalled = time.monotonic()
        chunks = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
        assert lines[-1] == "data: [DONE]" or "data: [DONE]" in lines, lines[-3:]
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort", chunks[-1]
        proc.wait(30)
        assert time.monotonic() - signalled < 10
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "CancelledError" not in err, err


@pytest.mark.usefixtures("default_model")
def test_the_server_exits_non_zero_when_the_engine_loop_dies(capsys):
    """A device fault stops the engine loop (is_device_fault); the server must not stay up answering 503: it exits
    with ENGINE_STOPPED so that a supervisor restarts it. The fault is a real CUDA-error exception raised in a step
    (a logits processor raises it), which the engine loop treats as fatal."""
    import asyncio
    import threading

    from engine.core.cli_serve import ENGINE_STOPPED, listen_socket, serve
    from engine.core.engine.async_llm import AsyncLLM, EngineDeadError
    from engine.core.engine.llm import LLM
    from engine.core.engine.sampling_params import SamplingParams
    from engine.core.serving.app import build_app

    engine = AsyncLLM(LLM(kv_cache_bytes=16 << 20, max_num_seqs=4, max_model_len=128))
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    status = []
    thread = threading.Thread(target=lambda: status.append(serve(build_app(engine, "tiny"), engine, sock, "warning")))
    thread.start()
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            assert time.monotonic() < deadline
            time.sleep(0.1)

    def fault(token_ids, logits):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    async def doomed():
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("hi", SamplingParams(max_tokens=4, logits_processors=[fault])):
                pass

    asyncio.run(doomed())
    thread.join(30)
    assert not thread.is_alive() and status == [ENGINE_STOPPED]
    assert "the engine loop stopped" in capsys.readouterr().err


@pytest.mark.usefixtures("default_model")
def test_tensor_parallel_serve_answers_and_stops():
    """--tensor-parallel-size 2: the server's engine is rank 0 of two; SIGTERM stops it and its worker, exit 0."""
    port, proc = _serve("--tensor-parallel-size", "2", "--max-model-len", "256", "--served-model-name", "tiny",
                        "--log-level", "warning")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model="tiny", messages=question, temperature=0, max_tokens=16)
        assert "Paris" in r.choices[0].message.content
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


@pytest.mark.usefixtures("default_model")
def test_a_lost_tensor_parallel_rank_stops_the_server_non_zero():
    """The worker rank killed: the next request fails, and the server exits non-zero (a supervisor restarts it)
    instead of answering 503 with half a model."""
    import psutil

    port, proc = _serve("--tensor-parallel-size", "2", "--max-model-len", "256", "--served-model-name", "tiny",
                        "--log-level", "warning")
    try:
        workers = [c for c in psutil.Process(proc.pid).children() if "resource_tracker" not in " ".join(c.cmdline())]
        assert len(workers) == 1, [c.cmdline() for c in workers]
        workers[0].kill()  # the server reaps it (it is the server's child, not this test's)
        time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIError):
            client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode not in (0, None) and "rank 1 has exited" in err, err


@pytest.mark.parametrize("flag, says", [(["--data-parallel-size", "2"], "choose one"),
                                        (["--engine-process", "on"], "leave --engine-process at auto or off")])
def test_data_parallel_with_tensor_parallel_is_refused_before_loading(flag, says):
    proc = subprocess.run([sys.executable, "-m", "engine.core.cli", "serve", "--port", "0", *flag,
                           "--tensor-parallel-size", "2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_engine_process_auto_follows_the_platform():
    """auto: a process of its own on GPU platforms (every torch-accelerator plugin), in the server on the CPU,
    never with tensor parallelism; on / off as told."""
    import argparse

    from engine.core.cli_serve import engine_in_own_process
    from engine.core.platform import TorchAcceleratorPlatform
    from engine.platforms.cpu.platform import CpuPlatform
    from engine.platforms.cuda.platform import CudaPlatform
    from engine.platforms.rocm.platform import RocmPlatform
    from engine.platforms.xpu.platform import XpuPlatform

    assert all(issubclass(c, TorchAcceleratorPlatform) and c.serve_engine_process
               for c in (CudaPlatform, RocmPlatform, XpuPlatform))
    assert not CpuPlatform.serve_engine_process

    def args(mode, tp=1):
        return argparse.Namespace(engine_process=mode, tensor_parallel_size=tp, platform="cpu", dtype="float32")

    assert [engine_in_own_process(args(m)) for m in ("auto", "on", "off")] == [False, True, False]
    assert not engine_in_own_process(args("auto", tp=2))


@pytest.mark.usefixtures("default_model")
def test_engine_process_serves_from_a_child_process():
    """--engine-process on: one engine, in a process of its own (the server holds no model), streams the same greedy
    text the in-process engine gives offline with the model's sampling defaults (as the server applies them)."""
    import psutil

    from engine.core.engine.llm import LLM
    from engine.core.engine.sampling_params import SamplingParams

    llm = LLM(max_model_len=256)
    want = llm.generate(["The capital of France is"],
                        SamplingParams(**{**llm.generation_defaults, "temperature": 0, "max_tokens": 12}))
    port, proc = _serve("--engine-process", "on", "--max-model-len", "256", "--served-model-name", "tiny",
                        "--log-level", "warning")
    try:
        engines = [c for c in psutil.Process(proc.pid).children() if "resource_tracker" not in " ".join(c.cmdline())]
        assert len(engines) == 1, [c.cmdline() for c in engines]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        stream = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=12,
                                           temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices) == want[0].outputs[0].text
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


@pytest.mark.usefixtures("default_model")
def test_data_parallel_serve_answers_and_stops(tmp_path):
    """Two engine processes; chat prompts rendered in the API server with --chat-template (Qwen3's real one, whose
    prompt closes the <think> block when a request turns thinking off), so the deepseek_r1 reasoning parser, which
    otherwise starts inside the block, gives the answer as content."""
    template = tmp_path / "qwen3.jinja"
    template.write_text(real_chat_templates.template("Qwen-Qwen3-0.6B"))
    port, proc = _serve("--data-parallel-size", "2", "--max-model-len", "256", "--served-model-name", "tiny",
                        "--log-level", "warning", "--chat-template", str(template), "--reasoning-parser", "deepseek_r1")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        answers = [client.chat.completions.create(model="tiny", messages=question, temperature=0, max_tokens=16,
                                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                   for _ in range(3)]
        assert all("Paris" in r.choices[0].message.content for r in answers), answers
        assert all(r.choices[0].message.reasoning_content is None for r in answers), answers
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for reason in {r.choices[0].finish_reason for r in answers}:
            n = sum(r.choices[0].finish_reason == reason for r in answers)
            assert f'engine_requests_total{{finish_reason="{reason}",model_name="tiny"}} {n:.1f}' in metrics, metrics
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
