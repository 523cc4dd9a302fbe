"""Anything that predicts, in torch: a model artifact, a transformers dir or a members
artifact, behind the one `PredictionSource` interface that returns member logits `[N, M, C]`
plus the contract's uncertainty outputs (`MemberOutputs`), checked finite.

An ONNX artifact is the same interface on the export's ONNX Runtime Predictor: `OnnxSource`
and `open_source` (either backend, by the input's kind) are in `export/source.py`, above this
layer, so that `eval` and `predict` measure an exported model exactly as it is deployed.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts import MANIFEST_NAME, SourceRef, open_artifact, read_manifest
from uqcompress.data.dataset import LabeledData
from uqcompress.uq.calibration import Calibration
from uqcompress.uq.outputs import ModelOutputs, concat_outputs, non_finite_rows


@dataclass(frozen=True)
class MemberOutputs(ModelOutputs):
    """The four outputs (`uq.outputs.ModelOutputs`, probs/entropy/mutual_info in float64 for
    the metrics) and what eval and predict report of how they were made.

    Shape: member_logits `[N, M, C]`, probs `[N, C]`, entropy `[N]`, mutual_info `[N]`."""

    seconds: float  # model time only (warm forward passes / ONNX Runtime runs)
    truncated: int = 0  # texts cut to the max length (torch models; the first source's)
    # End to end: model time plus reading, tokenising or preprocessing the inputs and the
    # outputs' post-processing (`PredictionSource.predict`/`stream` set it).
    e2e_seconds: float = 0.0
    warmup_seconds: float = 0.0  # the untimed warm-up pass, in neither of the two


def concat_rows(parts: list[MemberOutputs]) -> MemberOutputs:
    """Outputs of consecutive slices of one data set, one after the other (batches, ranks'
    shards); their times and counts add up.

    Shape: each part's arrays `[N_i, ...]` -> `[sum N_i, ...]`.
    """
    return MemberOutputs(
        **concat_outputs(parts),
        seconds=sum(p.seconds for p in parts),
        truncated=sum(p.truncated for p in parts),
        e2e_seconds=sum(p.e2e_seconds for p in parts),
        warmup_seconds=sum(p.warmup_seconds for p in parts),
    )


def combine(outputs: list[MemberOutputs]) -> MemberOutputs:
    """Members of several sources side by side: a deep ensemble over all their members."""
    from uqcompress.uq.metrics import member_mutual_information, predictive_entropy, softmax

    if len(outputs) == 1:
        return outputs[0]
    logits = np.concatenate([o.member_logits for o in outputs], axis=1)  # [N, sum M, C]
    member_probs = softmax(logits)
    probs = member_probs.mean(axis=1)
    return MemberOutputs(
        member_logits=logits,
        probs=probs,
        entropy=predictive_entropy(probs),
        mutual_info=member_mutual_information(member_probs),
        seconds=sum(o.seconds for o in outputs),
        truncated=outputs[0].truncated,
        e2e_seconds=sum(o.e2e_seconds for o in outputs),
        warmup_seconds=sum(o.warmup_seconds for o in outputs),
    )


class PredictionSource(ABC):
    """One input of `eval`/`predict`."""

    ref: SourceRef
    path: Path
    labels: list[str]
    input_kind: str
    members: int
    parameters: int
    calibration: Calibration | None = None  # uqc calibrate: temperature, abstention rule
    workers: int = 0  # data-loader worker processes that read and preprocess (--workers)
    # Timing, the same on every backend: the first batch a source runs is run once untimed
    # (a warm-up), `seconds` is the model alone, `e2e_seconds` the whole call (inputs read,
    # tokenised or preprocessed, outputs post-processed), the warm-up in neither.
    warm: bool = False

    def predict(self, data: LabeledData, batch_size: int, max_length: int | None) -> MemberOutputs:
        """Run every example once. Non-finite outputs raise NonFiniteError (`check_finite`):
        every command that reads a source goes through here or `stream`."""
        start = time.perf_counter()
        outputs = self._predict(data, batch_size, max_length)
        return check_finite(_timed(outputs, time.perf_counter() - start), self)

    def stream(
        self, data: LabeledData, batch_size: int, max_length: int | None
    ) -> Iterator[MemberOutputs]:
        """The outputs batch by batch (the batches `predict` would run): only one batch of
        encoded inputs and outputs is held at a time. Checked as `predict` is; each batch's
        `e2e_seconds` is the time spent producing it (preprocessing included)."""
        seen = 0
        batches = self._stream(data, batch_size, max_length)
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return
            batch = _timed(batch, time.perf_counter() - start)
            yield check_finite(batch, self, seen)
            seen += len(batch.probs)

    def take_warmup(self) -> bool:
        """Whether the next batch is to be warmed up first (once per source)."""
        first, self.warm = not self.warm, True
        return first

    @abstractmethod
    def _predict(self, data: LabeledData, batch_size: int, max_length: int | None) -> MemberOutputs:
        """Run every example once (unchecked)."""

    def _stream(
        self, data: LabeledData, batch_size: int, max_length: int | None
    ) -> Iterator[MemberOutputs]:
        """`stream`, unchecked: slice by slice through `_predict`."""
        for start in range(0, len(data), batch_size):
            yield self._predict(take(data, start, start + batch_size), batch_size, max_length)

    def non_finite_weights(self) -> tuple[int, list[str]] | None:
        """For a non-finite output's message: `non_finite_weights` of the model (None: not
        inspected, as for an ONNX graph)."""
        return None


class TorchSource(PredictionSource):
    def __init__(
        self,
        path: Path,
        role: str,
        device: str,
        samples: int | None = None,
        sample_chunk: int | None = None,
        dtype: str = "float32",
    ) -> None:
        from uqcompress.models.loading import load_model, resolve_model_source

        source = resolve_model_source(path, role)
        self.ref, self.path, self.device = source.ref, path, device
        self.loaded = load_model(source, dtype)
        if samples is not None:
            _set_samples(self.loaded, samples, path)
        if hasattr(self.loaded.model, "sample_chunk"):  # a sampling model (DIRECTOR)
            setattr(self.loaded.model, "sample_chunk", sample_chunk)  # noqa: B010
        self.labels = self.loaded.labels
        self.input_kind = self.loaded.input_kind
        self.members = self.loaded.members
        self.parameters = self.loaded.num_parameters()
        self.calibration = self.loaded.calibration

    def non_finite_weights(self) -> tuple[int, list[str]] | None:
        from uqcompress.engine.finite import non_finite_weights

        return non_finite_weights(self.loaded.model)

    def _encode(self, data: LabeledData, max_length: int | None) -> Any:
        """The data encoded for this model (labels unused), its truncation count kept."""
        from uqcompress.data.encoding import encode

        encoded = encode(
            data,
            self.loaded,
            np.zeros(len(data), dtype=np.int64),
            max_length,
            workers=self.workers,
        )
        self.truncated = encoded.truncated
        return encoded

    def _outputs(
        self, member_logits: npt.NDArray[np.float32], seconds: float, truncated: int, warm: float
    ) -> MemberOutputs:
        """Calibrated (logits / T) and reduced as the exported graph does, in float32, so an
        abstention threshold splits the same values.

        Shape: member_logits `[N, M, C]`."""
        from uqcompress.uq.functional import as_deployed

        if self.calibration is not None:
            member_logits = member_logits / np.float32(self.calibration.temperature)
        probs, entropy, mutual_info = as_deployed(member_logits)
        return MemberOutputs(
            member_logits=member_logits,
            probs=probs.astype(np.float64),
            entropy=entropy.astype(np.float64),
            mutual_info=mutual_info.astype(np.float64),
            seconds=seconds,
            truncated=truncated,
            warmup_seconds=warm,
        )

    def _predict(self, data: LabeledData, batch_size: int, max_length: int | None) -> MemberOutputs:
        from uqcompress.engine.inference import predict_logits

        encoded = self._encode(data, max_length)
        prediction = predict_logits(
            self.loaded.model, encoded, batch_size, self.device, warmup=self.take_warmup()
        )
        return self._outputs(
            prediction.member_logits,
            prediction.seconds,
            encoded.truncated,
            prediction.warmup_seconds,
        )

    def _stream(
        self, data: LabeledData, batch_size: int, max_length: int | None
    ) -> Iterator[MemberOutputs]:
        """Images: the outputs batch by batch from one loader over the whole set (pixels are
        made per batch, and `--workers` processes start once, not per batch); the truncation
        count comes with the first batch. Text: slice by slice, as `predict` runs them (so
        the token ids of the whole set are never held at once)."""
        if data.input_kind != "image":
            yield from super()._stream(data, batch_size, max_length)
            return
        from uqcompress.engine.inference import iter_logits

        encoded = self._encode(data, max_length)
        truncated = encoded.truncated  # counted once, with the first batch
        for member_logits, seconds, warm in iter_logits(
            self.loaded.model, encoded, batch_size, self.device, warmup=self.take_warmup()
        ):
            yield self._outputs(member_logits, seconds, truncated, warm)
            truncated = 0


def check_finite(
    outputs: MemberOutputs, source: PredictionSource, first: int | None = None
) -> MemberOutputs:
    """The outputs, if every member logit, probability, entropy and mutual information is
        finite; else NonFiniteError naming the source, the examples and (torch) the weights that
        are not finite. `first`: the index of a streamed batch's first example in the data (None:
    the outputs of the whole data).

        Shape: as MemberOutputs (rows `N` first in every array).
    """
    from uqcompress.engine.finite import weights_summary
    from uqcompress.errors import NonFiniteError

    rows = len(outputs.probs)
    bad = non_finite_rows(outputs)
    if not bad.any():
        return outputs
    where = np.flatnonzero(bad)
    count = int(where.size)
    weights = source.non_finite_weights()
    more = ""
    if count > 1:
        more = f" and {count - 1} more of " + (
            f"the {rows}" if first is None else f"its batch of {rows}"
        )
    message = (
        f"{source.path} computes NaN or infinite outputs for example "
        f"{(first or 0) + int(where[0])}{more}"
    )
    if weights is None:  # an ONNX graph: its initialisers are not inspected here
        hint = "re-export it from a model whose outputs are finite"
    elif weights[0]:
        message += f"; {weights_summary(*weights)}"
        hint = "retrain or re-import the model from finite weights"
    else:
        message += "; its weights are all finite (an input overflows it)"
        hint = "check that example's input, or train the model with a lower --lr"
    raise NonFiniteError(message, hint=hint)


def _timed(outputs: MemberOutputs, elapsed: float) -> MemberOutputs:
    """The outputs with their end-to-end time: `elapsed` (the whole call) less the warm-up,
    never below the model time."""
    return replace(outputs, e2e_seconds=max(elapsed - outputs.warmup_seconds, outputs.seconds))


def peek_source(path: Path, role: str) -> tuple[SourceRef, int]:
    """Identity and member count of an input without loading it (ids are known up front)."""
    from uqcompress.models.loading import resolve_model_source

    kind = read_manifest(path).kind if (path / MANIFEST_NAME).is_file() else None
    if kind in ("onnx", "members", "model"):
        artifact = open_artifact(path, expect_kind=kind)
        return SourceRef.of(role, artifact), int(artifact.manifest.summary.get("members", 1))
    return resolve_model_source(path, role).ref, 1


def peek_calibration(path: Path) -> dict[str, object] | None:
    """The stored calibration of a model, model dir or ONNX artifact, without loading it."""
    from uqcompress.models.loading import CALIBRATION_KEY, raw_config

    kind = read_manifest(path).kind if (path / MANIFEST_NAME).is_file() else None
    if kind == "onnx":
        found = read_manifest(path).summary.get("calibration")
    else:
        found = raw_config(path).get(CALIBRATION_KEY)
    return found if isinstance(found, dict) else None


class MembersSource(PredictionSource):
    """A members artifact (uqc prune --members): its pruned models as one deep ensemble."""

    def __init__(self, path: Path, role: str, device: str) -> None:
        artifact = open_artifact(path, expect_kind="members")
        self.ref, self.path = SourceRef.of(role, artifact), path
        count = int(artifact.manifest.summary["members"])
        self.parts = [
            TorchSource(path / f"member{m}", f"{role}.member{m}", device) for m in range(count)
        ]
        self.labels = self.parts[0].labels
        self.input_kind = self.parts[0].input_kind
        self.members = count
        self.parameters = sum(p.parameters for p in self.parts)

    def _predict(self, data: LabeledData, batch_size: int, max_length: int | None) -> MemberOutputs:
        # each member checked on its own (`predict`): the message names the member
        return combine([p.predict(data, batch_size, max_length) for p in self.parts])


def _set_samples(loaded: object, samples: int, path: Path) -> None:
    """`eval --samples`: the roll-outs of a DIRECTOR student, the dropout samples of an MC
    Dropout model."""
    from uqcompress.errors import ConfigError
    from uqcompress.models.director_model import DirectorModel
    from uqcompress.models.director_model import with_samples as director_samples
    from uqcompress.models.kind_base import DIRECTOR_KEY, MC_DROPOUT_KEY
    from uqcompress.models.mc_dropout_model import MCDropoutModel
    from uqcompress.models.mc_dropout_model import with_samples as dropout_samples

    model = getattr(loaded, "model", None)
    config = getattr(loaded, "config", None)
    if isinstance(model, DirectorModel):
        director_samples(model, samples)
        key = DIRECTOR_KEY
    elif isinstance(model, MCDropoutModel):
        dropout_samples(model, samples)
        key = MC_DROPOUT_KEY
    else:
        raise ConfigError(
            f"--samples applies to DIRECTOR students and MC Dropout models; {path} is neither",
            hint="drop --samples",
        )
    setattr(config, key, {**getattr(config, key), "members": samples, "samples": samples})


def take(data: LabeledData, start: int, stop: int) -> LabeledData:
    """Examples `[start, stop)` of a data set (labels, texts or images sliced alike); the
    spec and fingerprint stay those of the whole set."""
    return replace(
        data,
        labels=data.labels[start:stop] if data.labels is not None else None,
        texts=data.texts[start:stop] if data.texts is not None else None,
        text_pairs=data.text_pairs[start:stop] if data.text_pairs is not None else None,
        images=(
            data.images.subset(range(start, min(stop, len(data.images))))
            if data.images is not None
            else None
        ),
    )


def stream_outputs(
    sources: list[PredictionSource], data: LabeledData, batch_size: int, max_length: int | None
) -> Iterator[MemberOutputs]:
    """Every source's outputs batch by batch, combined per batch into one deep ensemble.

    Shape: yields member_logits `[B, sum M, C]` (the last batch may be smaller).
    """
    streams = [s.stream(data, batch_size, max_length) for s in sources]
    for parts in zip(*streams, strict=True):
        yield combine(list(parts))


def predict_streamed(
    sources: list[PredictionSource], data: LabeledData, batch_size: int, max_length: int | None
) -> MemberOutputs | None:
    """All examples' outputs, filled batch by batch into arrays allocated once: what is kept
    grows with N only by the outputs themselves (member logits, probs, entropy, MI), never by
    encoded inputs or per-batch copies. None for an empty data set.

    Shape: member_logits `[N, M, C]`, probs `[N, C]`, entropy and mutual_info `[N]`.
    """
    total = len(data)
    filled = 0
    kept: MemberOutputs | None = None
    seconds, e2e, truncated = 0.0, 0.0, 0
    for batch in stream_outputs(sources, data, batch_size, max_length):
        rows = slice(filled, filled + len(batch.probs))
        if kept is None:
            members, classes = batch.member_logits.shape[1:]
            kept = MemberOutputs(
                member_logits=np.empty((total, members, classes), dtype=np.float32),
                probs=np.empty((total, classes), dtype=np.float64),
                entropy=np.empty(total, dtype=np.float64),
                mutual_info=np.empty(total, dtype=np.float64),
                seconds=0.0,
            )
        for into, values in zip(kept.arrays(), batch.arrays(), strict=True):
            into[rows] = values
        seconds += batch.seconds
        e2e += batch.e2e_seconds
        truncated += batch.truncated
        filled = rows.stop
    if kept is None:
        return None
    return replace(kept, seconds=seconds, e2e_seconds=e2e, truncated=truncated)


def predict_sharded(
    sources: list[PredictionSource], data: LabeledData, batch_size: int, max_length: int | None
) -> MemberOutputs | None:
    """`predict_streamed` over a multi-process launch: each process runs its contiguous shard
    of the examples (`runtime.distributed.shard_bounds`: each example exactly once), and rank
    0 gets every example's outputs in the original order (the other ranks get None). Model
    seconds and truncated texts are summed over the processes. With one process: all of
    them, here.

    Shape: as `predict_streamed`, on rank 0.
    """
    from uqcompress.runtime.distributed import agree, gather_objects, shard_bounds

    start, stop = shard_bounds(len(data))
    part = agree(lambda: predict_streamed(sources, take(data, start, stop), batch_size, max_length))
    gathered = gather_objects(part)
    if gathered is None:
        return None
    shards = [p for p in gathered if p is not None]
    if not shards:
        return None
    if len(shards) == 1:
        return shards[0]
    return concat_rows(shards)
