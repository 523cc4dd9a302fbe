"""`uqc serve`: a real uvicorn server on loopback, spoken to over HTTP with httpx. Its answers
equal the Predictor's, bad requests get 4xx JSON, concurrent requests are merged into fewer
Predictor calls and each still gets its own answers, and the CLI checks its options."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.serve.conftest import CountingPredictor, Running, running
from uqcompress.export.runtime import Predictor
from uqcompress.serve.app import Limits, create_app

TEXTS = [
    "good",
    "the movie was really very bad and the acting was awful and boring and the story was dull",
    "love it",
    "great fun and the best story",
    "poor",
    "hate the film",
    "wonderful acting",
    "the worst",
]
# Small bounds, so that every limit is cheap to cross.
TEXT_LIMITS = Limits(
    max_batch=16,
    max_wait_ms=50,
    max_body_bytes=16_384,
    max_examples=8,
    max_text_chars=400,
    max_image_bytes=4096,
)


@pytest.fixture(scope="module")
def text_predictor(bert_onnx: Path) -> Predictor:
    return Predictor(bert_onnx)


@pytest.fixture(scope="module")
def text_server(bert_onnx: Path, text_predictor: Predictor) -> Iterator[Running]:
    counting = CountingPredictor(text_predictor)
    with running(create_app(counting, TEXT_LIMITS, source=bert_onnx)) as server:
        server.app.state.counting = counting
        yield server


@pytest.fixture(scope="module")
def image_predictor(vit_onnx_nodata: Path) -> Predictor:
    return Predictor(vit_onnx_nodata)


@pytest.fixture(scope="module")
def image_server(vit_onnx_nodata: Path, image_predictor: Predictor) -> Iterator[Running]:
    limits = Limits(
        max_batch=8, max_wait_ms=20, max_examples=16, max_image_bytes=8192, max_image_pixels=4096
    )
    with running(create_app(image_predictor, limits, source=vit_onnx_nodata)) as server:
        yield server


def _post(server: Running, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/predict", json=body, timeout=30, **kw)


def _assert_rows_equal(rows: list[dict[str, Any]], want: Any) -> None:
    """The server's rows are the Predictor's outputs, example by example."""
    assert len(rows) == len(want.labels)
    np.testing.assert_allclose([r["probs"] for r in rows], want.probs, atol=1e-6, rtol=0)
    np.testing.assert_allclose([r["entropy"] for r in rows], want.entropy, atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        [r["mutual_information"] for r in rows], want.mutual_info, atol=1e-6, rtol=0
    )
    assert [r["label"] for r in rows] == want.labels
    assert [r["abstained"] for r in rows] == (
        [None] * len(rows) if want.abstain is None else [bool(a) for a in want.abstain]
    )


def _assert_error(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert "Traceback" not in body["error"] and "\n" not in body["error"]
    for word in words:
        assert word in body["error"], body["error"]
    return str(body["error"])


# -- text ---------------------------------------------------------------------------------


def test_text_predictions_equal_the_predictor(
    text_server: Running, text_predictor: Predictor
) -> None:
    response = _post(text_server, {"texts": TEXTS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["labels"] == text_predictor.labels == ["neg", "pos"]
    want = text_predictor.predict_texts(TEXTS)
    # the examples differ by far more than the tolerance: a mixed-up order would show
    assert want.probs[:, 0].max() - want.probs[:, 0].min() > 0.1
    _assert_rows_equal(body["predictions"], want)
    np.testing.assert_allclose([sum(r["probs"]) for r in body["predictions"]], 1.0, atol=1e-5)


def test_concurrent_clients_get_their_own_answers_in_fewer_predictor_calls(
    text_server: Running, text_predictor: Predictor
) -> None:
    counting = text_server.app.state.counting
    clients = 16
    # each client its own texts (one to three of them), in its own order
    requests = [[TEXTS[(i + j) % len(TEXTS)] for j in range(1 + i % 3)] for i in range(clients)]
    wanted = [text_predictor.predict_texts(texts) for texts in requests]
    calls_before, batches_before = counting.calls, text_server.batcher.batches
    barrier = threading.Barrier(clients)
    answers: list[Any] = [None] * clients

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as http:
            barrier.wait()
            answers[i] = http.post(f"{text_server.url}/predict", json={"texts": requests[i]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for i, response in enumerate(answers):
        assert response is not None and response.status_code == 200, i
        _assert_rows_equal(response.json()["predictions"], wanted[i])
    calls = counting.calls - calls_before
    assert 1 <= calls < clients, calls  # merged: fewer Predictor calls than requests
    assert text_server.batcher.batches - batches_before == calls
    # no call ran more than --max-batch examples, and some ran several requests' examples
    recent = counting.examples[calls_before:]
    assert max(recent) <= TEXT_LIMITS.max_batch and max(recent) > 3
    assert sum(recent) == sum(len(t) for t in requests)


def test_a_bad_request_in_a_merged_batch_fails_alone(
    text_server: Running, text_predictor: Predictor
) -> None:
    bodies = [{"texts": ["good", "bad"]}, {"texts": ["love it", "   "]}, {"texts": ["poor"]}]
    answers: list[Any] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def client(i: int) -> None:
        barrier.wait()
        answers[i] = _post(text_server, bodies[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    _assert_rows_equal(
        answers[0].json()["predictions"], text_predictor.predict_texts(["good", "bad"])
    )
    _assert_rows_equal(answers[2].json()["predictions"], text_predictor.predict_texts(["poor"]))
    # named by its place in its own request, with the fix
    _assert_error(answers[1], 422, "text 2 (counting from 1) has no real token", "(fix: ")


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, ["not valid JSON"]),
        (b"\xff\xfe", 400, ["not valid JSON"]),
        (b"[1, 2]", 422, ["must be a JSON object", '{"texts": [...]}']),
        (b"{}", 422, ["this model takes text"]),
        (b'{"texts": []}', 422, ['"texts" must be a non-empty list of strings']),
        (b'{"texts": "good"}', 422, ['"texts" must be a non-empty list of strings']),
        (b'{"texts": ["good", 3]}', 422, ['"texts"[1] is int, not a string']),
        (b'{"texts": ["good"], "extra": 1}', 422, ["unknown field 'extra'"]),
        (b'{"images": ["aGVsbG8="]}', 422, ["this model takes text"]),
        (b'{"texts": ["good"], "pairs": ["bad"]}', 422, ["fine-tuned on single texts"]),
        (json.dumps({"texts": ["good"] * 9}).encode(), 422, ["9 items", "at most 8"]),
        (json.dumps({"texts": ["a" * 401]}).encode(), 422, ["401 characters", "at most 400"]),
        (b'{"texts": [""]}', 422, ["text 1 (counting from 1) has no real token"]),
    ],
    ids=lambda v: v[:40].decode("latin-1") if isinstance(v, bytes) else str(v),
)
def test_bad_bodies_get_a_4xx_json_error(
    text_server: Running, text_predictor: Predictor, body: bytes, status: int, words: list[str]
) -> None:
    assert text_predictor.text_pair is False  # what the pairs case relies on
    response = httpx.post(
        f"{text_server.url}/predict",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    _assert_error(response, status, *words)


def test_an_oversize_body_is_refused_with_413(text_server: Running) -> None:
    # over 16 KB: refused for its size before anything else is read of it
    big = json.dumps({"texts": ["good film " * 2000]}).encode()
    assert len(big) > TEXT_LIMITS.max_body_bytes
    response = httpx.post(f"{text_server.url}/predict", content=big, timeout=30)
    _assert_error(response, 413, "larger than 16,384 bytes")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the server counts as it reads
        yield b'{"texts": ["'
        for _ in range(40):
            yield b"x" * 1000
        yield b'"]}'

    streamed = httpx.post(f"{text_server.url}/predict", content=chunks(), timeout=30)
    assert "content-length" not in {k.lower() for k in streamed.request.headers}
    _assert_error(streamed, 413, "larger than 16,384 bytes")
    # the server still answers afterwards
    assert _post(text_server, {"texts": ["good"]}).status_code == 200


class Broken(CountingPredictor):
    def predict_texts(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug deep inside")


def test_a_bug_is_a_json_500_with_its_traceback_on_stderr(
    text_predictor: Predictor, capfd: pytest.CaptureFixture[str]
) -> None:
    with running(create_app(Broken(text_predictor), Limits(max_wait_ms=0))) as server:
        capfd.readouterr()
        response = _post(server, {"texts": ["good"]})
        error = _assert_error(response, 500, "internal error (RuntimeError)")
        assert "a bug deep inside" not in error  # the cause is in the log, not the response
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200  # still up
    err = capfd.readouterr().err
    assert "uqc serve: internal error in /predict" in err
    assert "Traceback" in err and "RuntimeError: a bug deep inside" in err


def test_unknown_routes_and_methods_get_json_errors(text_server: Running) -> None:
    _assert_error(httpx.get(f"{text_server.url}/nope", timeout=30), 404, "Not Found")
    _assert_error(httpx.get(f"{text_server.url}/predict", timeout=30), 405, "Method Not Allowed")


def test_healthz_and_metadata(
    text_server: Running, text_predictor: Predictor, bert_onnx: Path
) -> None:
    from uqcompress.artifacts import read_manifest

    health = httpx.get(f"{text_server.url}/healthz", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["requests"] == text_server.batcher.requests
    meta = httpx.get(f"{text_server.url}/metadata", timeout=30).json()
    manifest = read_manifest(bert_onnx)
    assert meta["input_kind"] == "text"
    assert meta["input_names"] == text_predictor.input_names
    assert meta["labels"] == ["neg", "pos"]
    assert meta["members"] == 1
    assert meta["max_length"] == text_predictor.preprocessing["max_length"] > 0
    assert meta["text_pair"] is False
    assert meta["preprocessing"] == text_predictor.preprocessing
    assert meta["calibration"] is None and meta["sampling"] is None  # not calibrated
    assert meta["source_id"] == text_predictor.source_id
    assert meta["artifact"]["id"] == manifest.id and meta["artifact"]["kind"] == "onnx"
    assert meta["artifact"]["summary"] == json.loads(json.dumps(manifest.summary))
    assert meta["limits"]["max_batch"] == 16 and meta["limits"]["max_examples"] == 8


# -- images -------------------------------------------------------------------------------


def _png(pixels: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), "L").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_image_predictions_equal_the_predictor(
    image_server: Running, image_predictor: Predictor
) -> None:
    size = int(image_predictor.preprocessing["image_size"])
    assert image_predictor.preprocessing["num_channels"] == 1
    images = np.random.default_rng(0).integers(0, 256, size=(5, size, size))
    response = _post(image_server, {"images": [_png(image) for image in images]})
    assert response.status_code == 200, response.text
    want = image_predictor.predict_pixels(images[:, None].astype(np.float32))
    assert want.probs.std(axis=0).max() > 1e-4  # the examples are told apart
    _assert_rows_equal(response.json()["predictions"], want)
    assert response.json()["labels"] == image_predictor.labels

    meta = httpx.get(f"{image_server.url}/metadata", timeout=30).json()
    assert meta["input_kind"] == "image"
    assert (meta["image_size"], meta["num_channels"]) == (size, 1)
    assert meta["labels"] == [str(d) for d in range(10)]


def test_bad_images_get_a_4xx_json_error(image_server: Running, image_predictor: Predictor) -> None:
    too_many_pixels = _png(np.zeros((65, 64)))  # 4,160 > the fixture's 4,096
    _assert_error(_post(image_server, {"images": [too_many_pixels]}), 422, "65 pixels, more than")
    _assert_error(_post(image_server, {"images": ["not base64!"]}), 422, "not valid base64")
    garbage = base64.b64encode(b"no image here").decode()
    _assert_error(_post(image_server, {"images": [garbage]}), 422, "not a readable image file")
    huge = base64.b64encode(b"\x89PNG" + bytes(9000)).decode()
    _assert_error(_post(image_server, {"images": [huge]}), 422, "larger than 8,192 bytes")
    _assert_error(_post(image_server, {"texts": ["good"]}), 422, "this model takes images")


def test_images_of_other_sizes_are_resized_as_uqc_predict_resizes_them(
    image_server: Running, image_predictor: Predictor, tmp_path: Path
) -> None:
    # the toolchain's reading of the same files (transformers' ViTImageProcessor, PIL
    # backend) is the reference: the server must reproduce it without transformers
    from PIL import Image

    from uqcompress.data.images import read_image
    from uqcompress.models.preprocessing import ImagePreprocessing

    size = int(image_predictor.preprocessing["image_size"])
    assert image_predictor.preprocessing["processor"]["image_processor_type"] == (
        "ViTImageProcessor"
    )
    rng = np.random.default_rng(2)
    files, images = [], []
    for i, (height, width) in enumerate([(size * 3, size * 2), (5, 11), (size, size)]):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, size=(height, width)).astype(np.uint8)).save(path)
        files.append(base64.b64encode(path.read_bytes()).decode("ascii"))
        images.append(read_image(path, "L"))
    prep = ImagePreprocessing.from_metadata(image_predictor.preprocessing)
    want = image_predictor.predict_pixels(prep.resize(images))
    response = _post(image_server, {"images": files})
    assert response.status_code == 200, response.text
    assert want.probs.std(axis=0).max() > 1e-4  # the examples are told apart
    _assert_rows_equal(response.json()["predictions"], want)
    meta = httpx.get(f"{image_server.url}/metadata", timeout=30).json()
    assert meta["resizes_images"] is True


def test_an_export_whose_processor_crops_takes_only_its_own_size(
    image_predictor: Predictor,
) -> None:
    # a processor this server does not reproduce (a center crop after the resize): images
    # of the model's size pass, other sizes get a 422 that says what to send
    from fastapi.testclient import TestClient

    size = int(image_predictor.preprocessing["image_size"])
    cropping = CountingPredictor(image_predictor)
    processor = dict(image_predictor.preprocessing["processor"], do_center_crop=True)
    cropping.preprocessing = dict(image_predictor.preprocessing, processor=processor)
    with TestClient(create_app(cropping)) as client:
        assert client.get("/metadata").json()["resizes_images"] is False
        same = client.post("/predict", json={"images": [_png(np.zeros((size, size)))]})
        assert same.status_code == 200, same.text
        other = client.post("/predict", json={"images": [_png(np.zeros((size + 1, size)))]})
    assert other.status_code == 422
    assert f"the model takes {size}x{size} images" in other.json()["error"]
    assert "resize them before sending" in other.json()["error"]


CHILD = r"""
import json, sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
from fastapi.testclient import TestClient
from uqcompress.export.runtime import Predictor
from uqcompress.serve.app import create_app
from uqcompress.serve import server  # noqa: F401
from uqcompress.cli import serve_cmd  # noqa: F401

text, image = Predictor(sys.argv[1]), Predictor(sys.argv[2])
with TestClient(create_app(text)) as client:
    texts = client.post("/predict", json={"texts": ["good", "bad"]}).json()
with TestClient(create_app(image)) as client:
    images = client.post("/predict", json={"images": [sys.argv[3]]}).json()
print(json.dumps({
    "texts": texts,
    "images": images,
    "transformers": "transformers" in sys.modules,
    "torch_absent": sys.modules.get("torch") is None,
}))
"""


def test_the_server_runs_without_torch(
    bert_onnx: Path, vit_onnx_nodata: Path, image_predictor: Predictor
) -> None:
    size = int(image_predictor.preprocessing["image_size"])
    image = np.random.default_rng(1).integers(0, 256, size=(size, size))
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(bert_onnx), str(vit_onnx_nodata), _png(image)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["torch_absent"] and not got["transformers"]
    assert [r["label"] for r in got["texts"]["predictions"]] == (
        Predictor(bert_onnx).predict_texts(["good", "bad"]).labels
    )
    want = image_predictor.predict_pixels(image[None, None].astype(np.float32))
    _assert_rows_equal(got["images"]["predictions"], want)


# -- shutdown -----------------------------------------------------------------------------


def test_stopping_finishes_the_requests_in_flight(
    bert_onnx: Path, text_predictor: Predictor
) -> None:
    # A long wait: the request is still queued in the batcher when the stop comes.
    app = create_app(text_predictor, Limits(max_wait_ms=1000), source=bert_onnx)
    answer: list[Any] = []
    with running(app) as server:
        thread = threading.Thread(target=lambda: answer.append(_post(server, {"texts": TEXTS})))
        thread.start()
        deadline = time.monotonic() + 20
        while server.batcher.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.batcher.requests == 1
        server.server.should_exit = True  # what SIGTERM sets
        thread.join(timeout=30)
    assert answer and answer[0].status_code == 200, answer
    _assert_rows_equal(answer[0].json()["predictions"], text_predictor.predict_texts(TEXTS))
    assert not server.batcher.accepting


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_uqc_serve_answers_then_stops_on_sigterm_after_its_request(
    bert_onnx: Path, text_predictor: Predictor
) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "uqcompress", "serve", str(bert_onnx)),
            *("--port", str(port), "--max-wait-ms", "1000"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "UQC_THREADS": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "uqc serve did not come up"
            time.sleep(0.1)
        answer: list[Any] = []
        thread = threading.Thread(
            target=lambda: answer.append(httpx.post(f"{url}/predict", json={"texts": TEXTS}))
        )
        thread.start()
        while httpx.get(f"{url}/healthz", timeout=5).json()["requests"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # while the request waits in the batcher
        thread.join(timeout=30)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == ""  # logs go to stderr
    assert f"on http://127.0.0.1:{port}" in err
    assert answer and answer[0].status_code == 200
    _assert_rows_equal(answer[0].json()["predictions"], text_predictor.predict_texts(TEXTS))


# -- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--max-batch", "2000"],
            "error: --max-batch 2000 is more than 1,024 (a batch's examples are held in memory "
            "and run at once) (fix: pass --max-batch 1024 or less)",
        ),
        (
            ["--max-batch", "0"],
            "error: --max-batch 0 must be at least 1 (fix: pass --max-batch 32)",
        ),
        (
            ["--max-wait-ms", "1001"],
            "error: --max-wait-ms 1001 is more than 1,000 (each request may wait this long for "
            "others to batch with) (fix: pass --max-wait-ms 1000 or less)",
        ),
        (
            ["--max-wait-ms", "-1"],
            "error: --max-wait-ms -1 must be 0 or more (fix: pass --max-wait-ms 5)",
        ),
        (["--port", "0"], "error: --port 0 is not a TCP port (1..65535) (fix: pass --port 8000)"),
        (["--port", "70000"], "error: --port 70000 is not a TCP port (1..65535)"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_1(
    cli: Callable[..., Any], bert_onnx: Path, args: list[str], line: str
) -> None:
    result = cli("serve", bert_onnx, *args)
    assert result.code == 1
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.err


def test_a_model_artifact_is_refused_in_one_line(
    cli: Callable[..., Any], tiny_bert_artifact: Path
) -> None:
    result = cli("serve", tiny_bert_artifact)
    assert result.code == 1
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "is a model artifact; uqc serve runs an ONNX export" in lines[0]
    assert "uqc export" in lines[0] and "--format onnx" in lines[0]


def test_a_taken_port_is_one_line(cli: Callable[..., Any], bert_onnx: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = cli("serve", bert_onnx, "--port", str(port))
    assert result.code == 1
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], result.err


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn"])
def test_a_missing_serve_extra_is_one_line(
    cli: Callable[..., Any], bert_onnx: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # `import fastapi` now raises ImportError
    result = cli("serve", bert_onnx)
    assert result.code == 1
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert f"uqc serve needs {missing}, which is not installed" in lines[0]
    assert "(fix: pip install 'uqcompress[serve]')" in lines[0]
