"""`uqc serve`: an ONNX export behind HTTP (the `serve` extra: FastAPI and uvicorn)."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Quiet, Verbose, resolve_input

MAX_BATCH, MAX_WAIT_MS = 32, 5  # the defaults of --max-batch and --max-wait-ms


def check_options(host: str, port: int, max_batch: int, max_wait_ms: int) -> None:
    """Every problem of the options at once (ConfigProblems), each a line with its fix."""
    from uqcompress.errors import Problems
    from uqcompress.runtime.limits import bound_problems

    problems = Problems()
    if not host.strip():
        problems.add("--host is empty", hint="pass --host 127.0.0.1")
    if not 1 <= port <= 65535:
        problems.add(f"--port {port} is not a TCP port (1..65535)", hint="pass --port 8000")
    counts = (("max_batch", max_batch, MAX_BATCH), ("max_wait_ms", max_wait_ms, MAX_WAIT_MS))
    for name, value, default in counts:
        found = bound_problems(name, value, "--" + name.replace("_", "-"), default)  # shared
        if found is not None:
            problems.add(found[0], hint=found[1])
    problems.raise_any()


def serve(
    export: Annotated[
        str,
        typer.Argument(
            help="An onnx artifact (uqc export --format onnx) or a model.onnx file ('-' "
            "reads the path from stdin)."
        ),
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on: 127.0.0.1 serves this machine only; 0.0.0.0 every "
            "interface (put authentication in front of it: the server has none).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port, 1..65535.")] = 8000,
    max_batch: Annotated[
        int,
        typer.Option(
            "--max-batch",
            help="Most examples run in one model call, at most 1,024: concurrent requests "
            "are merged up to it. 1 runs each example alone.",
        ),
    ] = MAX_BATCH,
    max_wait_ms: Annotated[
        int,
        typer.Option(
            "--max-wait-ms",
            help="How long (ms, 0..1,000) the first request of a batch waits for others to "
            "join it.",
        ),
    ] = MAX_WAIT_MS,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Serve an ONNX export over HTTP, micro-batching concurrent requests.

    POST /predict takes JSON {"texts": [...]} (with "pairs": [...] for a pair model) or
    {"images": [base64 PNG or JPEG of the model's size, ...]} and returns, per example,
    label, probs (in the order of "labels"), entropy, mutual_information and abstained
    (null without a calibrated abstention rule). GET /metadata: the input contract;
    GET /healthz: 200 while serving. Concurrent requests are merged into one model call
    of up to --max-batch examples. Errors are JSON {"error": "..."}. Runs until SIGTERM
    or Ctrl-C, which finish the requests in flight first. Logs go to stderr."""
    import sys

    from uqcompress.runtime.console import stderr, user

    check_options(host, port, max_batch, max_wait_ms)
    from uqcompress.serve.deps import require_serve

    require_serve()
    from uqcompress.artifacts import MANIFEST_NAME, read_manifest
    from uqcompress.errors import ConfigError
    from uqcompress.export.runtime import Predictor
    from uqcompress.serve.app import Limits, create_app
    from uqcompress.serve.server import bind, make_server

    path = resolve_input(export)
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        kind = read_manifest(path).kind
        if kind != "onnx":
            raise ConfigError(
                f"{path} is a {kind} artifact; uqc serve runs an ONNX export",
                hint=f"export it first: uqc export {path} --format onnx",
            )
    predictor = Predictor(path)
    limits = Limits(max_batch=max_batch, max_wait_ms=max_wait_ms)
    app = create_app(predictor, limits, source=path if path.is_dir() else None)
    sock = bind(host, port)
    where = f"[{host}]" if ":" in host else host
    stderr.print(
        f"serving {user(path)} ({predictor.input_kind} model, {len(predictor.labels)} "
        f"labels) on http://{where}:{sock.getsockname()[1]} (POST /predict, GET /metadata, "
        f"GET /healthz; max batch {max_batch}, max wait {max_wait_ms} ms); SIGTERM or Ctrl-C "
        "stops it",
        soft_wrap=True,
    )
    try:
        make_server(app, sock).run(sockets=[sock])
    finally:
        sock.close()
    sys.stderr.flush()
