"""Running the app: a listening socket bound up front (so a taken port or unknown host is
one line, not uvicorn's traceback-free exit) and a uvicorn server that stops on SIGTERM or
Ctrl-C after the requests in flight have finished and the batcher has drained."""

from __future__ import annotations

import contextlib
import copy
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from uqcompress.errors import ConfigError

# uvicorn takes this many connections and tasks at once; beyond it, 503 at once: a bound on
# what can queue in front of the batcher.
LIMIT_CONCURRENCY = 1024


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (port 0: any free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            f"--host {host} is not an address of this machine ({exc.strerror})",
            hint="pass --host 127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)",
        ) from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pass another --port, or stop what listens there",
        ) from exc
    sock.set_inheritable(True)
    return sock


def log_config() -> dict[str, Any]:
    """uvicorn's logging, with the access log on stderr too: stdout stays clean."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    return config


class Server(uvicorn.Server):
    """uvicorn's server, which on SIGTERM or SIGINT stops gracefully (no new connections,
    requests in flight finished, then the app's lifespan ends, draining the batcher) and
    returns, instead of raising the signal again once stopped (a second Ctrl-C forces the
    exit, as in uvicorn)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def make_server(app: Any, sock: socket.socket, access_log: bool = True) -> Server:
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_config=log_config(),
        access_log=access_log,
        limit_concurrency=LIMIT_CONCURRENCY,
        server_header=False,
    )
    return Server(config)
