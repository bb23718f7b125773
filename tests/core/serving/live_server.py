"""Start a real server (uvicorn in a thread, 127.0.0.1, a free port) on the default model."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class Running:
    url: str
    server: object
    thread: threading.Thread

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(app) -> Running:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{port}", server, thread)
