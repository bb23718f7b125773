"""``engine serve``: the OpenAI-compatible HTTP server (FastAPI + uvicorn) on the async engine."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
import threading

from .serving import tls


def add_arguments(p) -> None:
    from .cli_generate import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="the model id clients send (default: the model file's name)")
    p.add_argument("--api-key", default=os.environ.get("ENGINE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $ENGINE_API_KEY; unset: no key)")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="requests waiting for a slot before new ones get 503 with Retry-After")
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="sequences computed together in one step (per engine process)")
    p.add_argument("--engine-process", default="auto", choices=("auto", "on", "off"),
                   help="run the engine in a process of its own, as --data-parallel-size does, also for one engine: "
                        "the server's work per streamed chunk then shares no interpreter lock with the engine loop "
                        "(auto: on for GPU platforms, off on the CPU)")
    p.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                   help="N engine processes behind this server, each loading the model on its own share of the "
                        "machine (cores on a CPU, one device each on GPUs); requests go to the least busy")
    p.add_argument("--max-model-len", type=int, default=None, help="cap the context (default: the model's)")
    p.add_argument("--key-health-and-metrics", action="store_true",
                   help="require --api-key on /health and /metrics too (default: open, for load balancers and "
                        "Prometheus scrapers)")
    p.add_argument("--reasoning-parser", metavar="NAME",
                   help="split the model's thinking into reasoning_content: deepseek_r1, qwen3 (or a plugin's name)")
    p.add_argument("--tool-call-parser", metavar="NAME",
                   help="read the tool calls the model writes (tool_choice auto): hermes (Qwen 2.5/3, Hermes), "
                        "llama3_json, mistral (or a plugin's name)")
    p.add_argument("--loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                   help="uvicorn's event loop (auto: uvloop where installed, as with uvicorn[standard])")
    p.add_argument("--http", default="auto", choices=("auto", "h11", "httptools"),
                   help="uvicorn's HTTP/1.1 parser (auto: httptools where installed)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    tls.add_arguments(p)


def model_name(llm, given: str | None) -> str:
    if given:
        return given
    return os.path.splitext(os.path.basename(str(llm.checkpoint_source).rstrip("/")))[0] or "default"


def run(args) -> int:
    try:
        import uvicorn  # noqa: F401  (checked here, before the model loads; serve() uses it)

        from .serving.app import build_app
    except ImportError as exc:
        raise RuntimeError(f"engine serve needs the serving extra: pip install -e '.[serve]' in the source checkout "
                           f"({exc})") from exc
    from .cli_generate import load_llm
    from .engine.async_llm import AsyncLLM

    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.data_parallel_size < 1:
        raise ValueError(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    if args.tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    if args.data_parallel_size > 1 and args.tensor_parallel_size > 1:
        raise ValueError("--data-parallel-size with --tensor-parallel-size is not supported yet: choose one")
    if args.engine_process == "on" and args.tensor_parallel_size > 1:
        raise ValueError("--engine-process on with --tensor-parallel-size is not supported yet (the tensor-parallel "
                         "ranks are the engine's own processes): leave --engine-process at auto or off")
    if args.key_health_and_metrics and not args.api_key:
        raise ValueError("--key-health-and-metrics needs --api-key (or $ENGINE_API_KEY): there is no key to require")
    ssl_options = tls.uvicorn_options(args)
    for flag, module in (("--loop", args.loop), ("--http", args.http)):
        if module in ("uvloop", "httptools") and importlib.util.find_spec(module) is None:
            raise ValueError(f"{flag} {module}: {module} is not installed; pip install {module} (or "
                             f"'uvicorn[standard]'), or leave {flag} at auto")
    from .serving import parsers

    for find, name in ((parsers.reasoning_parser, args.reasoning_parser), (parsers.tool_parser, args.tool_call_parser)):
        if name:
            find(name)  # an unknown name is one line before the model loads
    # Claim the port before the model loads and before anything says it is serving: a port in use is one line.
    try:
        sock = listen_socket(args.host, args.port)
    except OSError as exc:
        print(f"engine serve: cannot listen on {args.host}:{args.port}: {exc.strerror or exc} (is another server "
              "running there? pick another --port)", file=sys.stderr, flush=True)
        return 2
    if args.data_parallel_size > 1 or engine_in_own_process(args):
        async_llm = data_parallel_engine(args)
    else:
        llm = load_llm(args, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len)
        async_llm = AsyncLLM(llm, max_queue=args.max_queue)
    name = model_name(async_llm.llm, args.served_model_name)
    app = build_app(async_llm, name, api_key=args.api_key, key_health_and_metrics=args.key_health_and_metrics,
                    reasoning_parser=args.reasoning_parser, tool_call_parser=args.tool_call_parser)
    scheme = "https" if ssl_options else "http"
    print(f"engine serve: model {name!r} on {scheme}://{args.host}:{args.port}/v1", flush=True)
    return serve(app, async_llm, sock, args.log_level, {**ssl_options, "loop": args.loop, "http": args.http})


def engine_in_own_process(args) -> bool:
    """--engine-process: on, off, or auto (the platform's ``serve_engine_process``; never with tensor parallelism,
    whose ranks are processes already)."""
    if args.engine_process != "auto":
        return args.engine_process == "on"
    if args.tensor_parallel_size > 1:
        return False
    from .cli_generate import checked_platform

    return checked_platform(args).serve_engine_process


def data_parallel_engine(args):
    """DataParallelLLM for --data-parallel-size: the platform and dtype checked here, the model loaded by each
    engine process."""
    from .cli import resume_gc
    from .cli_generate import checked_platform, llm_kwargs, use_chat_template
    from .engine.data_parallel import DataParallelLLM

    platform = checked_platform(args)
    engine = DataParallelLLM({**llm_kwargs(args), "platform": platform.name, "max_num_seqs": args.max_num_seqs,
                              "max_model_len": args.max_model_len}, args.data_parallel_size, platform,
                             max_queue=args.max_queue)
    use_chat_template(engine.llm, args)  # chat prompts are rendered here, in the API server
    resume_gc()
    return engine


ENGINE_STOPPED = 3  # the exit status when the engine loop died under the server (a device fault)


def serve(app, async_llm, sock: socket.socket, log_level: str = "info", options: dict | None = None) -> int:
    """Serve ``app`` on the listening ``sock`` until a signal (exit 0, streams ended cleanly) or until the engine loop
    stops under it (a device fault: /health answers 503 meanwhile, then exit ENGINE_STOPPED, so that a supervisor
    restarts the process instead of it answering 503 forever). ``options``: more uvicorn.Config keywords (TLS, the
    event loop, the HTTP parser)."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, **(options or {}))
    stopped: list[str] = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # SIGINT/SIGTERM: in-flight requests end now, each stream with a final chunk (finish_reason "abort")
            # and [DONE], so their connections close and the server exits at once, without cancelling them.
            async_llm.abort_all()
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if not stopped and not self.should_exit and not async_llm.is_running:
                stopped.append(repr(async_llm.error))
                print(f"engine serve: the engine loop stopped ({stopped[0]}); exiting with status {ENGINE_STOPPED} "
                      "so that a supervisor restarts the server", file=sys.stderr, flush=True)
                return True
            return await super().on_tick(counter)

    # uvicorn re-raises the signal it shut down on once it has shut down: SIGINT as KeyboardInterrupt (caught
    # below), SIGTERM to this handler (the default one would kill the process, status -15). The shutdown before it
    # was the graceful one: exit 0.
    main = threading.current_thread() is threading.main_thread()  # (signals are the main thread's only)
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: None) if main else None
    try:
        Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        async_llm.shutdown()
        sock.close()
    return ENGINE_STOPPED if stopped else 0


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening, as uvicorn would make it; OSError if it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock
