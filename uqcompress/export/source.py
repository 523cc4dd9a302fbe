"""An ONNX artifact as a prediction source (the export's torch-free Predictor), and
`open_source`: the source of any model input, torch or ONNX Runtime, by its kind.

`eval` and `predict` see both backends through `engine.sources.PredictionSource`, so an
exported model is measured exactly as it will be deployed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts import MANIFEST_NAME, SourceRef, open_artifact, read_manifest
from uqcompress.data.dataset import LabeledData
from uqcompress.engine.sources import (
    MemberOutputs,
    MembersSource,
    PredictionSource,
    TorchSource,
    concat_rows,
)


class OnnxSource(PredictionSource):
    def __init__(
        self,
        path: Path,
        role: str,
        device: str,
        threads: int | None,
        sample_chunk: int | None = None,
    ) -> None:
        from uqcompress.export.runtime import Predictor

        artifact = open_artifact(path, expect_kind="onnx")
        self.ref, self.path = SourceRef.of(role, artifact), path
        self.predictor = Predictor(path, device=device, threads=threads, sample_chunk=sample_chunk)
        self.labels = self.predictor.labels
        self.input_kind = self.predictor.input_kind
        self.members = self.predictor.members
        self.parameters = int(artifact.manifest.summary.get("parameters", 0))
        self.calibration = self.predictor.calibration

    def _predict(self, data: LabeledData, batch_size: int, max_length: int | None) -> MemberOutputs:
        from uqcompress.errors import DataError

        parts = list(self._stream(data, batch_size, max_length))
        if not parts:
            raise DataError("nothing to predict: no examples", hint="pass non-empty data")
        return concat_rows(parts)

    def _inputs(self, data: LabeledData, batch_size: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
        """The graph's inputs batch by batch, tokenised or preprocessed outside the timer.
        Images: one loader over the whole set (its `--workers` processes start once)."""
        from uqcompress.errors import DataError

        if data.input_kind != self.input_kind:
            raise DataError(
                f"{data.spec} holds {data.input_kind} examples; {self.path} takes "
                f"{self.input_kind}",
                hint="pass data of the kind the model was built for",
            )
        if data.input_kind == "text":
            assert data.texts is not None
            texts, pairs = data.texts, data.text_pairs
            for i in range(0, len(texts), batch_size):
                yield self.predictor.encode_texts(
                    texts[i : i + batch_size],
                    pairs[i : i + batch_size] if pairs is not None else None,
                )
        else:
            yield from onnx_pixel_batches(self.predictor, data, batch_size, self.workers)

    def _stream(
        self, data: LabeledData, batch_size: int, max_length: int | None
    ) -> Iterator[MemberOutputs]:
        """Batch by batch; only the ONNX Runtime run is in `seconds` (the first batch run
        once untimed before, as torch's)."""
        for inputs in self._inputs(data, batch_size):
            warm = 0.0
            if self.take_warmup():
                warm = time.perf_counter()
                self.predictor.run(inputs)
                warm = time.perf_counter() - warm
            start = time.perf_counter()
            result = self.predictor.run(inputs)
            yield _from_prediction(result, time.perf_counter() - start, warm)


def _from_prediction(result: Any, seconds: float, warmup: float = 0.0) -> MemberOutputs:
    """A Predictor's `Prediction` as the outputs eval and predict read (float64 metrics)."""
    return MemberOutputs(**result.outputs(np.float64), seconds=seconds, warmup_seconds=warmup)


def onnx_pixel_batches(
    predictor: Any, data: LabeledData, batch_size: int, workers: int = 0
) -> Iterator[dict[str, npt.NDArray[np.float32]]]:
    """The Predictor's inputs for image data, batch by batch: the export's image processor
    (from its metadata) resizes each image, the Predictor rescales and normalises.

    Shape: yields pixel_values `[B, C, H, W]` float32.
    """
    from uqcompress.data.encoding import encode_images, make_loader
    from uqcompress.models.preprocessing import ImagePreprocessing

    prep = ImagePreprocessing.from_metadata(predictor.preprocessing)
    raw = encode_images(
        data, prep, np.zeros(len(data), dtype=np.int64), normalise=False, workers=workers
    )
    for batch in make_loader(raw, batch_size):
        yield predictor.encode_pixels(batch["pixel_values"].numpy())


def open_source(
    path: Path,
    role: str,
    device: str = "cpu",
    threads: int | None = None,
    samples: int | None = None,
    sample_chunk: int | None = None,
    dtype: str = "float32",
) -> PredictionSource:
    """A model artifact or transformers dir runs in torch (its weights as `dtype`); an onnx
    artifact in ONNX Runtime. `sample_chunk`: a sampling model's samples per pass (None:
    sized to memory)."""
    from uqcompress.errors import ConfigError

    kind = read_manifest(path).kind if (path / MANIFEST_NAME).is_file() else None
    if samples is not None and kind in ("onnx", "members"):
        raise ConfigError(
            f"--samples applies to DIRECTOR students and MC Dropout models in torch; {path} "
            f"is a {kind} artifact (an exported graph has its sample count fixed)",
            hint="drop --samples, or export the model after choosing its samples",
        )
    if kind == "onnx":
        return OnnxSource(path, role, device, threads, sample_chunk)
    if kind == "members":
        return MembersSource(path, role, device)
    return TorchSource(path, role, device, samples, sample_chunk, dtype)
