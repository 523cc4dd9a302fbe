"""What does micro-batching buy `uqc serve`? A bounded load run on loopback, side by side:

- `uqc serve` with micro-batching (`--max-batch B --max-wait-ms W`, defaults 32 and 5);
- `uqc serve --max-batch 1` (every example its own model call);
- a plain Predictor loop in this process (one Predictor call per request, an image decoded
  as the server decodes it, no HTTP at all): the floor of one-at-a-time serving.

Two exports (random weights, nothing downloaded; `uqc export --format onnx`), each its own
table (`--family bert`, `vit` or `both`):
- BERT-small-shaped (4 layers, hidden 512, 8 heads; `uqc init --family bert --preset small
  --set ...`, 2 labels); a request is one short text (6-40 words of the shipped vocabulary,
  seeded);
- ViT-S/16-shaped (12 layers, hidden 384, 6 heads, 224 x 224 RGB in 16-px patches; `uqc
  init --family vit --preset base --set ...`, 10 labels); a request is one 224 x 224 PNG
  (seeded noise, base64), decoded by the server.

A fourth row, the Predictor alone on the same requests in batches of `--max-batch`, is the
ceiling of what merging can buy: on a CPU whose per-example model time hardly falls with
the batch, micro-batching can only save the per-call overhead. A grid of the graph alone
(ms per example at batch 1 to 32; text at 8, 24 and 48 tokens) shows where that ceiling
comes from.

Each server is a fresh `uqc serve` process on a free 127.0.0.1 port; `--concurrency` client
threads (one keep-alive `http.client` connection each) send `--requests` requests in
all, then the run stops. Per mode: wall seconds, requests per second, p50 and p99 latency
(ms, send to answer, as each client sees it), the Predictor calls the server made (its
/healthz `batches`) and the CPU time per request of the server process and of the clients.
The clients share this machine's cores with the server, so they are the standard library's
`http.client`: httpx cost 2.6-3.2 ms of client CPU per request here (0.1-0.3 ms with
`http.client`), taken from the server it was measuring. The absolute numbers depend on the
machine and on what else runs; nothing here asserts on them.

`--int8` adds the same rows for the export quantized by `uqc quantize --mode dynamic`
(int8 weights; VNNI kernels on this CPU). The weights are random, so the quantizer's drift
gate is loosened for this speed measurement only (it compares near-uniform probabilities).

    .venv/bin/python benchmarks/serve_load.py [--family both] [--requests 400]
        [--concurrency 16] [--max-batch 32] [--max-wait-ms 5] [--int8] [--keep DIR]
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.client
import io
import json
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


# The published shapes, random weights: BERT-small (Turc et al. 2019: 4 layers, hidden 512,
# 8 heads) and ViT-S/16 (Touvron et al. 2021: 12 layers, hidden 384, 6 heads, 224 px RGB).
FAMILIES = {
    "bert": (
        "BERT-small-shaped (4 layers, hidden 512)",
        (
            *("--family", "bert", "--preset", "small", "--set", "hidden_size=512"),
            *("--set", "num_attention_heads=8", "--set", "intermediate_size=2048"),
            *("--labels", "neg,pos"),
        ),
    ),
    "vit": (
        "ViT-S/16-shaped (12 layers, hidden 384, 224x224 RGB)",
        (
            *("--family", "vit", "--preset", "base", "--set", "hidden_size=384"),
            *("--set", "num_attention_heads=6", "--set", "intermediate_size=1536"),
            *("--labels", ",".join(str(d) for d in range(10))),
        ),
    ),
}
IMAGE_SIDE = 224


def build_export(root: Path, family: str) -> Path:
    model = root / family
    onnx = root / f"{family}-onnx"
    if not (onnx / "model.onnx").is_file():
        if not (model / "manifest.json").is_file():
            _uqc("init", *FAMILIES[family][1], "--out", str(model))
        _uqc("export", str(model), "--format", "onnx", "--out", str(onnx))
    return onnx


def build_int8(root: Path, family: str, export: Path, bodies: list[dict[str, list[str]]]) -> Path:
    """`export` quantized by `uqc quantize --mode dynamic`. Random weights give near-uniform
    probabilities whose argmax flips under any rounding, so the drift gate's bounds are
    opened: this artifact measures speed, never quality."""
    out = root / f"{family}-int8"
    if (out / "model.onnx").is_file():
        return out
    gate = root / f"{family}-gate"
    if family == "bert":
        import csv

        gate.mkdir(parents=True, exist_ok=True)
        with open(gate / "gate.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for i, body in enumerate(bodies[:64]):
                writer.writerow([body["texts"][0], ("neg", "pos")[i % 2]])
        data = gate / "gate.csv"
    else:
        for i, body in enumerate(bodies[:64]):
            folder = gate / str(i % 10)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.png").write_bytes(base64.b64decode(body["images"][0]))
        data = gate
    _uqc(
        *("quantize", str(export), "--mode", "dynamic", "--data", str(data), "--out", str(out)),
        *("--min-agreement", "0", "--max-ece-delta", "1", "--max-nll-delta", "1"),
        *("--max-entropy-shift", "1", "--max-mi-shift", "1"),
    )
    return out


def make_bodies(family: str, n: int, seed: int = 0) -> list[dict[str, list[str]]]:
    """`n` request bodies of one example each: a short text, or a base64 PNG."""
    rng = random.Random(seed)
    if family == "bert":
        return [{"texts": [" ".join(rng.choices(WORDS, k=rng.randint(6, 40)))]} for _ in range(n)]
    from PIL import Image

    pixels = np.random.default_rng(seed)
    bodies = []
    for _ in range(n):
        buffer = io.BytesIO()
        noise = pixels.integers(0, 256, size=(IMAGE_SIDE, IMAGE_SIDE, 3)).astype(np.uint8)
        Image.fromarray(noise, "RGB").save(buffer, format="PNG")
        bodies.append({"images": [base64.b64encode(buffer.getvalue()).decode("ascii")]})
    return bodies


@dataclass
class Result:
    mode: str
    requests: int
    concurrency: int
    wall_s: float
    latencies_ms: list[float]
    calls: int | None
    server_cpu_s: float | None = None  # the server process's CPU time over the timed part
    client_cpu_s: float | None = None  # this process's (the clients') CPU time over it

    def row(self) -> str:
        lat = np.asarray(self.latencies_ms)

        def per_request(cpu_s: float | None) -> str:
            return f"{1000 * cpu_s / self.requests:.2f}" if cpu_s is not None else "-"

        return (
            f"| {self.mode} | {self.requests} | {self.concurrency} | {self.wall_s:.2f} | "
            f"{self.requests / self.wall_s:.1f} | {np.percentile(lat, 50):.1f} | "
            f"{np.percentile(lat, 99):.1f} | {self.calls if self.calls is not None else '-'} | "
            f"{per_request(self.server_cpu_s)} | {per_request(self.client_cpu_s)} |"
        )


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def plain_loop(export: Path, bodies: list[dict[str, list[str]]]) -> Result:
    """One Predictor call per request in this process, doing the server's work (an image
    is decoded as the server decodes it) without HTTP."""
    from uqcompress.export.runtime import Predictor
    from uqcompress.serve.app import decode_images, server_resize

    predictor = Predictor(export)
    size = int(predictor.preprocessing.get("image_size", 0) or 0)
    channels = int(predictor.preprocessing.get("num_channels", 0) or 0)
    resize = server_resize(predictor)

    def one(body: dict[str, list[str]]) -> None:
        if "texts" in body:
            predictor.predict_texts(body["texts"])
        else:
            files = [base64.b64decode(item) for item in body["images"]]
            predictor.predict_pixels(decode_images(files, size, channels, resize))

    for body in bodies[:4]:  # warm-up
        one(body)
    latencies = []
    start = time.perf_counter()
    for body in bodies:
        t0 = time.perf_counter()
        one(body)
        latencies.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - start
    return Result("Predictor loop (no HTTP)", len(bodies), 1, wall, latencies, len(bodies))


def plain_batches(export: Path, bodies: list[dict[str, list[str]]], batch: int) -> Result:
    """The Predictor alone on the same examples, `batch` per call (images decoded first):
    the model's own gain from batching, without HTTP."""
    from uqcompress.export.runtime import Predictor
    from uqcompress.serve.app import decode_images, server_resize

    predictor = Predictor(export)
    chunks = [bodies[i : i + batch] for i in range(0, len(bodies), batch)]
    size = int(predictor.preprocessing.get("image_size", 0) or 0)
    channels = int(predictor.preprocessing.get("num_channels", 0) or 0)
    resize = server_resize(predictor)

    def run(chunk: list[dict[str, list[str]]]) -> None:
        if "texts" in chunk[0]:
            predictor.predict_texts([b["texts"][0] for b in chunk], batch_size=batch)
        else:
            files = [base64.b64decode(b["images"][0]) for b in chunk]
            predictor.predict_pixels(decode_images(files, size, channels, resize), batch)

    calls = [functools.partial(run, chunk) for chunk in chunks]
    calls[0]()  # warm-up
    latencies = []
    start = time.perf_counter()
    for call in calls:
        t0 = time.perf_counter()
        call()
        latencies.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - start
    mode = f"Predictor, batches of {batch} (no HTTP; ms per call)"
    return Result(mode, len(bodies), 1, wall, latencies, len(calls))


GRID_BATCHES = (1, 2, 4, 8, 16, 32)
GRID_TOKENS = (8, 24, 48)  # text lengths (tokens) of the grid's rows


def batch_grid(export: Path) -> list[str]:
    """The graph alone (ONNX Runtime, no tokenizer, no image decoding), ms per example at
    each batch size of GRID_BATCHES: one row per text length of GRID_TOKENS, or one row of
    224 x 224 images. What merging requests can buy at most, shape by shape."""
    from uqcompress.export.runtime import Predictor

    predictor = Predictor(export)
    session = predictor.session
    rng = np.random.default_rng(0)
    lines = [
        "| input | " + " | ".join(f"batch {b}" for b in GRID_BATCHES) + " |",
        "|---|" + "---|" * len(GRID_BATCHES),
    ]
    shapes = [f"{t} tokens" for t in GRID_TOKENS] if predictor.input_kind == "text" else ["image"]
    for shape, tokens in zip(shapes, GRID_TOKENS, strict=False):
        cells = []
        for batch in GRID_BATCHES:
            feeds: dict[str, Any] = {}
            for graph_input in session.get_inputs():
                name = graph_input.name
                if predictor.input_kind == "image":
                    side = (batch, 3, IMAGE_SIDE, IMAGE_SIDE)
                    feeds[name] = rng.uniform(0, 255, side).astype(np.float32)
                elif "mask" in name:
                    feeds[name] = np.ones((batch, tokens), np.int64)
                elif "type" in name:
                    feeds[name] = np.zeros((batch, tokens), np.int64)
                else:  # token ids: small ids, inside any vocabulary
                    feeds[name] = rng.integers(5, 100, (batch, tokens)).astype(np.int64)
            for _ in range(2):  # warm-up
                session.run(None, feeds)
            runs = max(3, 48 // batch)
            t0 = time.perf_counter()
            for _ in range(runs):
                session.run(None, feeds)
            cells.append(f"{1000 * (time.perf_counter() - t0) / runs / batch:.2f}")
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return lines


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
    export: Path,
    bodies: list[dict[str, list[str]]],
    concurrency: int,
    max_batch: int,
    max_wait_ms: int,
) -> Result:
    # the server's access log goes to a file: a pipe nobody reads could fill and block it
    with tempfile.TemporaryFile(mode="w+") as log:
        return _served(export, bodies, concurrency, max_batch, max_wait_ms, log)


def _served(
    export: Path,
    bodies: list[dict[str, list[str]]],
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
            for body in bodies[:4]:
                warm.post(f"{url}/predict", json=body).raise_for_status()
        before = httpx.get(f"{url}/healthz").json()["batches"]
        latencies: list[float] = []
        lock = threading.Lock()
        next_index = iter(range(len(bodies)))
        errors: list[str] = []
        # bodies encoded up front: the clients' own work per request is the HTTP exchange
        encoded = [json.dumps(body).encode() for body in bodies]
        headers = {"Content-Type": "application/json"}

        def client() -> None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                while True:
                    with lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    t0 = time.perf_counter()
                    connection.request("POST", "/predict", body=encoded[i], headers=headers)
                    response = connection.getresponse()
                    text = response.read()
                    took = (time.perf_counter() - t0) * 1000
                    with lock:
                        latencies.append(took)
                        if response.status != 200:
                            errors.append(text.decode(errors="replace"))
            finally:
                connection.close()

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        server_cpu, client_cpu = _process_cpu_s(proc.pid), _own_cpu_s()
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        server_cpu, client_cpu = _process_cpu_s(proc.pid) - server_cpu, _own_cpu_s() - client_cpu
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
    return Result(mode, len(bodies), concurrency, wall, latencies, calls, server_cpu, client_cpu)


def parse_args() -> argparse.Namespace:
    """The options, every count bounded before anything is built."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("bert", "vit", "both"), default="both")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=int, default=5)
    parser.add_argument(
        "--int8", action="store_true", help="also measure the dynamic int8 quantized export"
    )
    parser.add_argument("--keep", type=Path, help="build (or reuse) the exports here")
    args = parser.parse_args()
    if not 1 <= args.requests <= 100_000 or not 1 <= args.concurrency <= 256:
        raise SystemExit("--requests must be 1..100000 and --concurrency 1..256")
    if not 1 <= args.max_batch <= 256 or not 0 <= args.max_wait_ms <= 1000:
        raise SystemExit("--max-batch must be 1..256 and --max-wait-ms 0..1000")
    return args


def main() -> None:
    args = parse_args()
    families = ["bert", "vit"] if args.family == "both" else [args.family]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for family in families:
            t0 = time.perf_counter()
            export = build_export(root, family)
            print(f"export {export} ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            bodies = make_bodies(family, args.requests)
            variants = [("float32", export)]
            if args.int8:
                variants.append(("dynamic int8", build_int8(root, family, export, bodies)))
            for variant, path in variants:
                measure(family, variant, path, bodies, args)


def measure(
    family: str, variant: str, export: Path, bodies: list[dict[str, list[str]]], args: Any
) -> None:
    """The four rows for one export, printed as one table with its ratios."""
    results = [
        served(export, bodies, args.concurrency, args.max_batch, args.max_wait_ms),
        served(export, bodies, args.concurrency, 1, 0),
        plain_loop(export, bodies),
        plain_batches(export, bodies, args.max_batch),
    ]
    what = "one-text" if family == "bert" else "one-image"
    print(
        f"\n# uqc serve load: {FAMILIES[family][0]} export, {variant}, {args.requests} {what} "
        f"requests, {args.concurrency} concurrent clients, {os.cpu_count()} CPU cores "
        f"(shared with the clients), load average {os.getloadavg()[0]:.2f}\n"
    )
    print(
        "| mode | requests | clients | wall s | req/s | p50 ms | p99 ms | Predictor calls "
        "| server CPU ms/req | client CPU ms/req |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        print(result.row())
    batched, single, loop, ceiling = results
    p50, p99 = np.percentile(batched.latencies_ms, [50, 99])
    print(
        f"\nmicro-batching: {single.wall_s / batched.wall_s:.2f}x the throughput of "
        f"--max-batch 1; p99 {p99 / p50:.2f}x p50; the model alone: batches of "
        f"{args.max_batch} {loop.wall_s / ceiling.wall_s:.2f}x one at a time",
        flush=True,
    )
    print("\nthe graph alone, ms per example by batch size:\n")
    print("\n".join(batch_grid(export)), flush=True)


if __name__ == "__main__":
    main()
