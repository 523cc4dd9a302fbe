"""What does micro-batching buy `uqc serve`? A bounded load run on loopback, side by side:

- `uqc serve` with micro-batching (`--max-batch B --max-wait-ms W`, defaults 32 and 5);
- `uqc serve --max-batch 1` (every example its own model call);
- a plain Predictor loop in this process (one `predict_texts([text])` call per request, no
  HTTP at all): the floor of one-at-a-time serving.

The model is a BERT-small-shaped classifier (`uqc init --family bert --preset small`: 4
layers, hidden 256, 2 labels; random weights, nothing downloaded) exported with
`uqc export --format onnx`. Requests are one short text each (6-40 words of the shipped
vocabulary, seeded). Each server is a fresh `uqc serve` process on a free 127.0.0.1 port;
`--concurrency` client threads (one httpx connection each) send `--requests` requests in
all, then the run stops. Per mode: wall seconds, requests per second, p50 and p99 latency
(ms, send to answer, as each client sees it) and the Predictor calls the server made (its
/healthz `batches`). Client threads, server and model share this machine's cores, so
the absolute numbers depend on it and on what else runs; nothing here asserts on them.

    .venv/bin/python benchmarks/serve_load.py [--requests 400] [--concurrency 16]
        [--max-batch 32] [--max-wait-ms 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WORDS = [
    *("the", "movie", "film", "was", "really", "very", "story", "acting", "and", "it"),
    *("good", "great", "love", "excellent", "amazing", "wonderful", "best", "fun"),
    *("bad", "awful", "terrible", "hate", "worst", "boring", "poor", "dull"),
]


def _uqc(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "uqcompress", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"uqc {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout.strip()


def build_export(root: Path) -> Path:
    model = root / "bert-small"
    onnx = root / "bert-small-onnx"
    if not (onnx / "model.onnx").is_file():
        if not (model / "manifest.json").is_file():
            _uqc("init", "--family", "bert", "--preset", "small", "--labels", "neg,pos",
                 "--out", str(model))  # fmt: skip
        _uqc("export", str(model), "--format", "onnx", "--out", str(onnx))
    return onnx


def make_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 40))) for _ in range(n)]


@dataclass
class Result:
    mode: str
    requests: int
    concurrency: int
    wall_s: float
    latencies_ms: list[float]
    calls: int | None

    def row(self) -> str:
        lat = np.asarray(self.latencies_ms)
        return (
            f"| {self.mode} | {self.requests} | {self.concurrency} | {self.wall_s:.2f} | "
            f"{self.requests / self.wall_s:.1f} | {np.percentile(lat, 50):.1f} | "
            f"{np.percentile(lat, 99):.1f} | {self.calls if self.calls is not None else '-'} |"
        )


def plain_loop(export: Path, texts: list[str]) -> Result:
    from uqcompress.export.runtime import Predictor

    predictor = Predictor(export)
    predictor.predict_texts(texts[:4])  # warm-up
    latencies = []
    start = time.perf_counter()
    for text in texts:
        t0 = time.perf_counter()
        predictor.predict_texts([text])
        latencies.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - start
    return Result("Predictor loop (no HTTP)", len(texts), 1, wall, latencies, len(texts))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen[str]) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"uqc serve exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("uqc serve did not come up in 120 s")


def served(
    export: Path, texts: list[str], concurrency: int, max_batch: int, max_wait_ms: int
) -> Result:
    # the server's access log goes to a file: a pipe nobody reads could fill and block it
    with tempfile.TemporaryFile(mode="w+") as log:
        return _served(export, texts, concurrency, max_batch, max_wait_ms, log)


def _served(
    export: Path,
    texts: list[str],
    concurrency: int,
    max_batch: int,
    max_wait_ms: int,
    log: Any,
) -> Result:
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "uqcompress", "serve", str(export), "--port", str(port)),
            *("--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )
    try:
        _wait_up(url, proc)
        with httpx.Client() as warm:  # warm-up, not timed
            for text in texts[:4]:
                warm.post(f"{url}/predict", json={"texts": [text]}).raise_for_status()
        before = httpx.get(f"{url}/healthz").json()["batches"]
        latencies: list[float] = []
        lock = threading.Lock()
        next_index = iter(range(len(texts)))
        errors: list[str] = []

        def client() -> None:
            with httpx.Client(timeout=60) as http:
                while True:
                    with lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    t0 = time.perf_counter()
                    response = http.post(f"{url}/predict", json={"texts": [texts[i]]})
                    took = (time.perf_counter() - t0) * 1000
                    with lock:
                        latencies.append(took)
                        if response.status_code != 200:
                            errors.append(response.text)

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        if errors:
            raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
        calls = httpx.get(f"{url}/healthz").json()["batches"] - before
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    mode = (
        f"uqc serve --max-batch {max_batch} --max-wait-ms {max_wait_ms}"
        if max_batch > 1
        else "uqc serve --max-batch 1"
    )
    return Result(mode, len(texts), concurrency, wall, latencies, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="build (or reuse) the export here")
    args = parser.parse_args()
    if not 1 <= args.requests <= 100_000 or not 1 <= args.concurrency <= 256:
        raise SystemExit("--requests must be 1..100000 and --concurrency 1..256")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        export = build_export(root)
        print(f"export {export} ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        texts = make_texts(args.requests)
        results = [
            served(export, texts, args.concurrency, args.max_batch, args.max_wait_ms),
            served(export, texts, args.concurrency, 1, 0),
            plain_loop(export, texts),
        ]
    print(
        f"# uqc serve load: BERT-small-shaped export, {args.requests} one-text requests, "
        f"{args.concurrency} concurrent clients, {os.cpu_count()} CPU cores (shared with the "
        "clients)\n"
    )
    print("| mode | requests | clients | wall s | req/s | p50 ms | p99 ms | Predictor calls |")
    print("|---|---|---|---|---|---|---|---|")
    for result in results:
        print(result.row())


if __name__ == "__main__":
    main()
