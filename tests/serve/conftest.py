"""Real uvicorn servers of `uqc serve` apps on free loopback ports, each in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")


class CountingPredictor:
    """A Predictor whose predict calls are counted (the batcher's merging shows there)."""

    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor
        self.calls = 0
        self.examples: list[int] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.predictor, name)

    def _count(self, n: int) -> None:
        with self._lock:
            self.calls += 1
            self.examples.append(n)

    def predict_texts(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self._count(len(texts))
        return self.predictor.predict_texts(texts, *args, **kwargs)

    def predict_pixels(self, pixels: Any, *args: Any, **kwargs: Any) -> Any:
        self._count(len(pixels))
        return self.predictor.predict_pixels(pixels, *args, **kwargs)


@dataclass
class Running:
    url: str
    server: Any
    app: Any
    thread: threading.Thread

    @property
    def batcher(self) -> Any:
        return self.app.state.batcher


@contextmanager
def running(app: Any) -> Iterator[Running]:
    """Serve `app` on 127.0.0.1 at a free port until the block ends (then stop it as SIGTERM
    would: `should_exit`, which finishes the requests in flight)."""
    from uqcompress.serve.server import bind, make_server

    sock = bind("127.0.0.1", 0)
    server = make_server(app, sock, access_log=False)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", server, app, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"
