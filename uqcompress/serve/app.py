"""The FastAPI app of `uqc serve`: `POST /predict`, `GET /healthz`, `GET /metadata`.

`create_app(predictor, limits)` wraps a torch-free `Predictor`; requests are validated here
(body size, examples per request, characters per text, bytes and size per image) and
micro-batched by `batching.MicroBatcher`, whose single worker is started and drained by the
app's lifespan (uvicorn runs the lifespan's end after the requests in flight have finished).

Every error is JSON `{"error": "..."}`: 4xx for a request that cannot be served (the message
says what was wrong and how to fix it), 500 for a bug, whose traceback goes to stderr.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import sys
import traceback
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from uqcompress.errors import UqcError
from uqcompress.export import contract
from uqcompress.models.preprocessing import plain_resize
from uqcompress.serve.batching import MicroBatcher, ShuttingDown

TEXTS, PAIRS, IMAGES = "texts", "pairs", "images"


@dataclass(frozen=True)
class Limits:
    """What one request may hold, and how requests are batched."""

    max_batch: int = 32  # examples per Predictor call (the batcher's bound)
    max_wait_ms: int = 5  # how long the first request of a batch waits for others
    max_body_bytes: int = 8 * 1024 * 1024  # the request body, as sent
    max_examples: int = 256  # texts or images per request
    max_text_chars: int = 10_000  # characters per text (and per pair text)
    max_image_bytes: int = 4 * 1024 * 1024  # one image's file, decoded from base64
    max_image_pixels: int = 25_000_000  # one image's width x height, read from its header


class RequestError(Exception):
    """A request that cannot be served: its status and the one-line message sent back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _one_line(exc: UqcError) -> str:
    return exc.message + (f" (fix: {exc.hint})" if exc.hint else "")


def _internal(exc: BaseException, where: str) -> JSONResponse:
    """A bug: its traceback on stderr, a JSON 500 to the client (no traceback there)."""
    sys.stderr.write(f"uqc serve: internal error in {where}:\n")
    traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.flush()
    return _error(500, f"internal error ({type(exc).__name__}); the server log has the cause")


# -- request parsing ----------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 above `limit` bytes. An oversized body that is
    not far over the limit is read to its end and dropped, so that the client, which is
    still sending it, reads the 413 rather than a reset connection."""
    declared = request.headers.get("content-length")
    too_large = RequestError(
        413, f"the request body is larger than {limit:,} bytes; send fewer or smaller examples"
    )
    drain = 4 * limit + 1024 * 1024  # read at most this much of a body that is refused
    if declared is not None and declared.isdigit() and int(declared) > drain:
        raise too_large
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > drain:
            break
        if total <= limit:
            chunks.append(chunk)
    if total > limit:
        raise too_large
    return b"".join(chunks)


def _strings(body: dict[str, Any], field: str, limits: Limits) -> list[str]:
    """A field that holds a list of strings, each text within `max_text_chars` (images are
    bounded in bytes once decoded: `_decode_base64`)."""
    value = body[field]
    if not isinstance(value, list) or not value:
        raise RequestError(422, f'"{field}" must be a non-empty list of strings')
    if len(value) > limits.max_examples:
        raise RequestError(
            422,
            f'"{field}" holds {len(value):,} items; a request takes at most '
            f"{limits.max_examples:,} (split it into several requests)",
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RequestError(422, f'"{field}"[{i}] is {type(item).__name__}, not a string')
        if field != IMAGES and len(item) > limits.max_text_chars:
            raise RequestError(
                422,
                f'"{field}"[{i}] has {len(item):,} characters; at most '
                f"{limits.max_text_chars:,} are taken per text (the model reads only its "
                "first tokens anyway)",
            )
    return value


def parse_request(raw: bytes, input_kind: str, text_pair: bool | None, limits: Limits) -> Any:
    """A /predict body checked against the model: ("texts", texts, pairs or None) or
    ("images", [image file bytes]). Raises RequestError (400 or 422) with the reason."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(400, f"the request body is not valid JSON ({exc})") from exc
    wanted = (
        '{"texts": [...]}' + (' with "pairs": [...]' if text_pair is not False else "")
        if input_kind == "text"
        else '{"images": [base64 PNG or JPEG, ...]}'
    )
    if not isinstance(body, dict):
        raise RequestError(422, f"the request body must be a JSON object: {wanted}")
    unknown = sorted(set(body) - {TEXTS, PAIRS, IMAGES})
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}; send {wanted}")
    if input_kind == "image":
        if TEXTS in body or PAIRS in body or IMAGES not in body:
            raise RequestError(422, f"this model takes images: send {wanted}")
        images = _strings(body, IMAGES, limits)
        return (IMAGES, [_decode_base64(i, item, limits) for i, item in enumerate(images)])
    if IMAGES in body or TEXTS not in body:
        raise RequestError(422, f"this model takes text: send {wanted}")
    texts = _strings(body, TEXTS, limits)
    pairs = _strings(body, PAIRS, limits) if PAIRS in body else None
    if pairs is not None and len(pairs) != len(texts):
        raise RequestError(
            422, f"{len(texts)} texts but {len(pairs)} pairs; send one pair text per text"
        )
    if text_pair is True and pairs is None:
        raise RequestError(
            422, 'the model was fine-tuned on text pairs; send "pairs" (one per text) too'
        )
    if text_pair is False and pairs is not None:
        raise RequestError(
            422, 'the model was fine-tuned on single texts; drop "pairs" from the request'
        )
    return (TEXTS, texts, pairs)


def _decode_base64(index: int, item: str, limits: Limits) -> bytes:
    if len(item) > 4 * (limits.max_image_bytes // 3 + 1) + 4:
        raise RequestError(
            422, f"image {index} is larger than {limits.max_image_bytes:,} bytes; send it smaller"
        )
    if item.startswith("data:") and "," in item:  # a data: URL
        item = item.split(",", 1)[1]
    try:
        data = base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(422, f"image {index} is not valid base64 ({exc})") from exc
    if len(data) > limits.max_image_bytes:
        raise RequestError(
            422, f"image {index} is larger than {limits.max_image_bytes:,} bytes; send it smaller"
        )
    if not data:
        raise RequestError(422, f"image {index} is empty")
    return data


def decode_images(
    files: list[bytes],
    size: int,
    channels: int,
    resize: tuple[int, int, int] | None = None,
    max_pixels: int = 25_000_000,
) -> npt.NDArray[np.float32]:
    """Image files as the Predictor's pixels on the 0..255 scale, read as `uqc predict` reads
    files: EXIF orientation applied, turned into the model's mode (`L` for a grey model,
    `RGB` for a colour one), then resized. `resize` is the export's processor resize
    (`models.preprocessing.plain_resize`: height, width, PIL filter), which PIL reproduces
    exactly without transformers; None (a processor that crops or resizes by the shortest
    edge) means images must already be `size` x `size`. Files of more than `max_pixels` are
    refused from their header, before any pixel is decoded.

    Shape: N files -> `[N, C, size, size]` float32.
    """
    import warnings

    from PIL import Image, ImageOps, UnidentifiedImageError

    from uqcompress.data.images import to_mode

    mode = "L" if channels == 1 else "RGB"
    out = []
    for i, data in enumerate(files):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as image:
                    width, height = image.size  # from the header
                    if resize is None and image.size != (size, size):
                        raise RequestError(
                            422,
                            f"image {i} is {width}x{height} pixels; the model takes "
                            f"{size}x{size} images and its image processor is not one this "
                            "server reproduces (resize them before sending)",
                        )
                    if width * height > max_pixels:
                        raise RequestError(
                            422,
                            f"image {i} is {width}x{height} pixels, more than "
                            f"{max_pixels:,}; send it smaller",
                        )
                    image.load()
                    upright = to_mode(ImageOps.exif_transpose(image) or image, mode)
                    if resize is not None:
                        # as transformers' PIL backend does it (image_transforms.resize)
                        new_height, new_width, resample = resize
                        upright = upright.resize(
                            (new_width, new_height), resample=resample, reducing_gap=None
                        )
                    pixels = np.asarray(upright, dtype=np.float32)
        except RequestError:
            raise
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Warning) as exc:
            raise RequestError(
                422, f"image {i} is not a readable image file ({type(exc).__name__}: {exc})"
            ) from exc
        out.append(pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32, copy=False)


# -- the app ------------------------------------------------------------------------------


def _rows(prediction: Any, start: int, stop: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(start, stop):
        entropy, mutual = float(prediction.entropy[i]), float(prediction.mutual_info[i])
        probs = [float(p) for p in prediction.probs[i]]
        if not all(math.isfinite(v) for v in (entropy, mutual, *probs)):
            raise ValueError(f"the model returned non-finite outputs for example {i - start}")
        rows.append(
            {
                "label": prediction.labels[i],
                "probs": probs,
                "entropy": entropy,
                "mutual_information": mutual,
                "abstained": (
                    bool(prediction.abstain[i]) if prediction.abstain is not None else None
                ),
            }
        )
    return rows


def server_resize(predictor: Any) -> tuple[int, int, int] | None:
    """The export's image resize (height, width, PIL filter) when this server can reproduce
    it without transformers and it makes the graph's size; None: images must come at it."""
    pre = predictor.preprocessing
    if predictor.input_kind != "image":
        return None
    size = int(pre.get("image_size", 0) or 0)
    resize = plain_resize(pre.get("processor"), int(pre.get("num_channels", 0) or 0))
    return resize if resize is not None and resize[:2] == (size, size) else None


def metadata(predictor: Any, source: Path | None, limits: Limits) -> dict[str, Any]:
    """The input contract, as the export's ONNX metadata and manifest hold it (no number the
    artifacts do not hold), plus this server's own limits."""
    meta = predictor.session.get_modelmeta().custom_metadata_map
    pre = dict(predictor.preprocessing)
    info: dict[str, Any] = {
        "input_kind": predictor.input_kind,
        "input_names": list(predictor.input_names),
        "labels": list(predictor.labels),
        "members": predictor.members,
        "format": meta.get(contract.META_FORMAT),
        "source_id": predictor.source_id or None,
        "source_kind": meta.get(contract.META_SOURCE_KIND),
        "preprocessing": pre,
        "calibration": (
            predictor.calibration.to_dict() if predictor.calibration is not None else None
        ),
        "sampling": dict(predictor.noise) if predictor.noise is not None else None,
    }
    if predictor.input_kind == "text":
        info["max_length"] = pre.get("max_length")
        info["text_pair"] = predictor.text_pair
    else:
        info["image_size"] = pre.get("image_size")
        info["num_channels"] = pre.get("num_channels")
        # whether this server resizes images of other sizes (the processor's PIL resize)
        info["resizes_images"] = server_resize(predictor) is not None
    if contract.META_QUANTIZATION in meta:
        try:
            info["quantization"] = json.loads(meta[contract.META_QUANTIZATION])
        except (json.JSONDecodeError, RecursionError):
            info["quantization"] = meta[contract.META_QUANTIZATION]
    info["artifact"] = _manifest(source)
    info["limits"] = asdict(limits)
    return info


def _manifest(source: Path | None) -> dict[str, Any] | None:
    from uqcompress.artifacts import MANIFEST_NAME, read_manifest

    if source is None or not (source / MANIFEST_NAME).is_file():
        return None
    manifest = read_manifest(source)
    return {
        "id": manifest.id,
        "kind": manifest.kind,
        "step": manifest.step,
        "created_utc": manifest.created_utc,
        "uqc_version": manifest.uqc_version,
        "summary": manifest.summary,
    }


def create_app(predictor: Any, limits: Limits | None = None, source: Path | None = None) -> FastAPI:
    """The app over `predictor` (an `export.runtime.Predictor`, or anything with its
    `predict_texts`/`predict_pixels` and attributes); `source`: the export directory whose
    manifest /metadata reports (None: none)."""
    limits = limits or Limits()
    info = metadata(predictor, source, limits)
    size = int(predictor.preprocessing.get("image_size", 0) or 0)
    channels = int(predictor.preprocessing.get("num_channels", 0) or 0)
    resize = server_resize(predictor)

    def run_batch(key: Hashable, payloads: list[Any]) -> list[Any]:
        """One Predictor call for the merged requests; each request's rows."""
        sizes = [len(p[0]) for p in payloads]
        if key == IMAGES:
            pixels = np.concatenate([p[0] for p in payloads])
            prediction = predictor.predict_pixels(pixels, batch_size=limits.max_batch)
        else:
            texts = [t for p in payloads for t in p[0]]
            pairs = [t for p in payloads for t in p[1]] if key == PAIRS else None
            prediction = predictor.predict_texts(texts, batch_size=limits.max_batch, pairs=pairs)
        out, start = [], 0
        for n in sizes:
            out.append(_rows(prediction, start, start + n))
            start += n
        return out

    batcher = MicroBatcher(run_batch, limits.max_batch, limits.max_wait_ms / 1000.0)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()  # after uvicorn has finished the requests in flight

    app = FastAPI(
        title="uqc serve",
        description="Predictions with uncertainty from an ONNX export of uqcompress.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.batcher = batcher
    app.state.limits = limits

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> JSONResponse:
        return _internal(exc, request.url.path)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        status = "ok" if batcher.accepting else "shutting down"
        return JSONResponse(
            {
                "status": status,
                "requests": batcher.requests,
                "batches": batcher.batches,
                "largest_batch": batcher.largest,
            },
            status_code=200 if batcher.accepting else 503,
        )

    @app.get("/metadata")
    async def get_metadata() -> JSONResponse:
        return JSONResponse(info)

    @app.post("/predict")
    async def predict(request: Request) -> JSONResponse:
        try:
            raw = await read_body(request, limits.max_body_bytes)
            parsed = parse_request(raw, predictor.input_kind, predictor.text_pair, limits)
            payload: tuple[Any, ...]
            if parsed[0] == IMAGES:
                pixels = await run_in_threadpool(
                    decode_images, parsed[1], size, channels, resize, limits.max_image_pixels
                )
                key, payload, n = IMAGES, (pixels,), len(pixels)
            else:
                _, texts, pairs = parsed
                key = PAIRS if pairs is not None else TEXTS
                payload, n = (texts, pairs), len(texts)
            rows = await batcher.submit(key, payload, n)
        except RequestError as exc:
            return _error(exc.status, exc.message)
        except UqcError as exc:  # the Predictor refused the input (a text with no real token)
            return _error(422, _one_line(exc))
        except ShuttingDown as exc:
            return _error(503, f"{exc}; retry on another instance")
        except Exception as exc:
            return _internal(exc, "/predict")
        return JSONResponse({"labels": info["labels"], "predictions": rows})

    return app
