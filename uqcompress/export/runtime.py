"""A torch-free predictor over ONNX Runtime: what a service deploys.

It needs only numpy, onnxruntime and (for text) tokenizers. It reads the metadata that
`uqc export` put into the graph, preprocesses exactly as the model was trained (tokeniser
file or image rescale/normalise), and returns labels, probabilities, entropy and mutual
information. Never import torch here: a test runs this module where torch cannot load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.errors import ArtifactError, DataError
from uqcompress.export import contract
from uqcompress.uq.calibration import Calibration, abstain_scores, abstains


@dataclass(frozen=True)
class Prediction:
    """Predictions for N examples. Shape: member_logits `[N, M, C]`, probs `[N, C]`,
    entropy `[N]`, mutual_info `[N]`; labels: N class names."""

    member_logits: npt.NDArray[np.float32]
    probs: npt.NDArray[np.float32]
    entropy: npt.NDArray[np.float32]
    mutual_info: npt.NDArray[np.float32]
    labels: list[str]
    # `[N]` bool, True where the model abstains; None when the model has no abstention rule
    abstain: npt.NDArray[np.bool_] | None = None


def _providers(device: str) -> list[str]:
    from uqcompress.deps import require_onnxruntime

    ort = require_onnxruntime()
    available = ort.get_available_providers()
    if device.startswith("cuda") and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class Predictor:
    """Run an exported model. ``source`` is an onnx artifact directory or a `.onnx` file
    (a text model then needs `tokenizer.json` beside it)."""

    def __init__(self, source: Path | str, device: str = "cpu", threads: int | None = None):
        from uqcompress.deps import require_onnxruntime

        ort = require_onnxruntime()
        source = Path(source)
        onnx_path = source / contract.ONNX_FILE if source.is_dir() else source
        if not onnx_path.is_file():
            raise ArtifactError(
                f"{source} holds no {contract.ONNX_FILE}",
                hint="pass an artifact written by uqc export --format onnx",
            )
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(onnx_path), sess_options=options, providers=_providers(device)
        )
        meta = self.session.get_modelmeta().custom_metadata_map
        if meta.get(contract.META_FORMAT) != contract.FORMAT_VERSION:
            raise ArtifactError(
                f"{onnx_path} was not written by uqc export (no uqc metadata of format "
                f"{contract.FORMAT_VERSION})",
                hint="export the model with uqc export --format onnx",
            )
        self.labels: list[str] = json.loads(meta[contract.META_LABELS])
        self.input_kind: str = meta[contract.META_INPUT_KIND]
        self.input_names: list[str] = json.loads(meta[contract.META_INPUT_NAMES])
        self.members = int(meta[contract.META_MEMBERS])
        self.preprocessing: dict[str, Any] = json.loads(meta[contract.META_PREPROCESSING])
        self.source_id = meta.get(contract.META_SOURCE_ID, "")
        # Sampling models: the noise spec; draws come from a NumPy generator seeded per call.
        self.noise: dict[str, Any] | None = (
            json.loads(meta[contract.META_NOISE]) if contract.META_NOISE in meta else None
        )
        # `uqc calibrate`: the temperature is in the graph; the abstention rule is applied here.
        self.calibration = (
            Calibration.from_dict(json.loads(meta[contract.META_CALIBRATION]))
            if contract.META_CALIBRATION in meta
            else None
        )
        self._tokenizer: Any = None
        if self.input_kind == "text":
            tokenizer_path = onnx_path.parent / self.preprocessing["tokenizer"]
            if not tokenizer_path.is_file():
                raise ArtifactError(
                    f"{tokenizer_path} is missing; a text model needs its tokenizer",
                    hint="keep tokenizer.json beside model.onnx (the export artifact has it)",
                )
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
            self._tokenizer.no_padding()
            self._tokenizer.enable_truncation(int(self.preprocessing["max_length"]))

    # -- inputs ---------------------------------------------------------------------------

    def encode_texts(self, texts: list[str]) -> dict[str, npt.NDArray[np.int64]]:
        """Tokenise, truncate and pad to the longest text.

        Shape: each of input_ids, attention_mask, token_type_ids `[N, T]` int64.
        """
        if self.input_kind != "text":
            raise DataError("this model takes images, not text", hint="pass image data")
        encodings = self._tokenizer.encode_batch([str(t) for t in texts])
        width = max(len(e.ids) for e in encodings)
        pad = int(self.preprocessing.get("pad_token_id", 0))
        ids = np.full((len(texts), width), pad, dtype=np.int64)
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for i, encoding in enumerate(encodings):
            ids[i, : len(encoding.ids)] = encoding.ids
            mask[i, : len(encoding.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    def encode_pixels(self, pixels: npt.NDArray[Any]) -> dict[str, npt.NDArray[np.float32]]:
        """Rescale and normalise images given on the 0..255 scale.

        Shape: pixels `[N, C, H, W]` -> pixel_values `[N, C, H, W]` float32.
        """
        if self.input_kind != "image":
            raise DataError("this model takes text, not images", hint="pass text data")
        from uqcompress.models.preprocessing import match_channels

        p = self.preprocessing
        size, channels = int(p["image_size"]), int(p["num_channels"])
        pixels = match_channels(pixels, channels)
        if pixels.ndim != 4 or pixels.shape[1:] != (channels, size, size):
            raise DataError(
                f"images have shape {tuple(pixels.shape)}; the model expects "
                f"[N, {channels}, {size}, {size}]",
                hint="pass images of the model's size and channels",
            )
        mean = np.asarray(p["image_mean"], dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(p["image_std"], dtype=np.float32).reshape(1, -1, 1, 1)
        scaled = pixels.astype(np.float32) * np.float32(p["rescale_factor"])
        return {"pixel_values": ((scaled - mean) / std).astype(np.float32)}

    # -- running --------------------------------------------------------------------------

    def draw_noise(
        self, inputs: dict[str, npt.NDArray[Any]], seed: int | None = None
    ) -> npt.NDArray[np.float32]:
        """Standard normal draws for a sampling model's `noise` input, from a NumPy generator
        seeded with `seed` (default: the seed in the metadata): reproducible per batch.

        Shape: `[B, S, K, T, d]`.
        """
        assert self.noise is not None, "this model takes no noise"
        first = next(iter(inputs.values()))
        tokens = self.noise["tokens"] or first.shape[1]
        shape = (
            first.shape[0],
            self.noise["samples"],
            self.noise["steps"],
            tokens,
            self.noise["hidden"],
        )
        rng = np.random.default_rng(self.noise["seed"] if seed is None else seed)
        return rng.standard_normal(shape, dtype=np.float32)

    def run(self, inputs: dict[str, npt.NDArray[Any]]) -> Prediction:
        """Run the graph on already-encoded inputs (a sampling model's noise is drawn when
        not given)."""
        if self.noise is not None and contract.NOISE_INPUT not in inputs:
            inputs = {**inputs, contract.NOISE_INPUT: self.draw_noise(inputs)}
        member_logits, probs, entropy, mutual_info = self.session.run(
            list(contract.OUTPUT_NAMES), {name: inputs[name] for name in self.input_names}
        )
        rule = self.calibration.abstain if self.calibration is not None else None
        return Prediction(
            member_logits=member_logits,
            probs=probs,
            entropy=entropy,
            mutual_info=mutual_info,
            labels=[self.labels[i] for i in np.argmax(probs, axis=1)],
            abstain=(
                abstains(rule, abstain_scores(probs, entropy, mutual_info))
                if rule is not None
                else None
            ),
        )

    def predict_texts(self, texts: list[str], batch_size: int = 64) -> Prediction:
        return self._batched(
            len(texts), batch_size, lambda s: self.encode_texts(texts[s.start : s.stop])
        )

    def predict_pixels(self, pixels: npt.NDArray[Any], batch_size: int = 64) -> Prediction:
        return self._batched(len(pixels), batch_size, lambda s: self.encode_pixels(pixels[s]))

    def _batched(self, n: int, batch_size: int, encode: Any) -> Prediction:
        if n == 0:
            raise DataError("nothing to predict: no examples", hint="pass non-empty data")
        parts = [self.run(encode(slice(i, i + batch_size))) for i in range(0, n, batch_size)]
        return Prediction(
            member_logits=np.concatenate([p.member_logits for p in parts]),
            probs=np.concatenate([p.probs for p in parts]),
            entropy=np.concatenate([p.entropy for p in parts]),
            mutual_info=np.concatenate([p.mutual_info for p in parts]),
            labels=[label for p in parts for label in p.labels],
            abstain=(
                np.concatenate([p.abstain for p in parts if p.abstain is not None])
                if parts[0].abstain is not None
                else None
            ),
        )
