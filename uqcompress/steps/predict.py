"""`uqc predict`: one JSON object per example (JSONL), written batch by batch.

A registered step that writes no artifact (no manifest, no id; `Step.writes_artifact` False, so
no `--json` and no recipe step): the adapter between a prediction source and a JSONL stream.
Memory stays flat in the number of examples: each batch's
records are written as soon as the batch is computed, to a temporary file (beside `--out`, or
an anonymous one for stdout), and the file is renamed into place (or copied to stdout) only
when every example is written, so a failed run leaves no partial output. In a multi-process
launch each process predicts its contiguous shard; rank 0 writes its own records as they come,
then the other shards' in rank order (their outputs gathered as arrays: probabilities, entropy,
mutual information).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts import MANIFEST_NAME
from uqcompress.errors import ArtifactError, ConfigError
from uqcompress.steps import config as fields


@dataclass(frozen=True)
class Shard:
    """What a non-zero rank sends rank 0: its examples' outputs, for their records.

    Shape: probs `[n, C]`, entropy and mutual_info `[n]`, abstain `[n]` bool or None.
    """

    start: int
    probs: npt.NDArray[np.float64]
    entropy: npt.NDArray[np.float64]
    mutual_info: npt.NDArray[np.float64]
    abstain: npt.NDArray[np.bool_] | None


@dataclass(frozen=True)
class PredictConfig:
    """What `uqc predict` reads and how it runs. Nothing is recorded (predict writes no
    artifact), so every field is a runtime one; the bounds and checks are every step's
    (`steps.config.problems`)."""

    data: str = fields.runtime(
        help="Examples: builtin:NAME\\[@split], FILE.csv, a "
        "folder or hf:NAME\\[/CONFIG]@SPLIT (a label column is not needed)."
    )
    batch_size: int = fields.runtime(64)
    max_length: int | None = fields.runtime(None)
    text_column: str = fields.runtime("text")
    text_pair_column: str | None = fields.runtime(None)
    # DIRECTOR, MC Dropout: samples per pass (None: sized to memory); memory and speed only
    sample_chunk: int | None = fields.runtime(
        None,
        help="DIRECTOR students, MC Dropout models: samples run per pass (memory and "
        "speed only, the same "
        "result). Default: as many as fit 16384 tokens (sequences x length) per pass.",
    )
    workers: int = fields.workers()
    device: str = fields.device(option_default="cpu")
    threads: int | None = fields.threads()
    # torch models only (an ONNX export runs its graph's own types); auto resolved on load
    dtype: str = fields.dtype()

    def validate(self) -> None:
        fields.problems(self).raise_any()  # non-finite numbers, choices, bounds


def run(model: Path, cfg: PredictConfig, out: Path | None = None, force: bool = False) -> int:
    """Predict every example of `cfg.data` with `model` and write its JSONL record: into `out`
    (built beside it, renamed when complete; an existing file only with `force`), or on
    stdout. Returns the number of records written (0 on the non-zero ranks of a
    multi-process launch). `cfg.device` and `cfg.threads` as resolved (`Step.run` does)."""
    import sys

    from uqcompress.data import load_data
    from uqcompress.export.source import open_source
    from uqcompress.runtime.distributed import rank_device
    from uqcompress.runtime.planning import PlannedPrediction, is_planning

    cfg.validate()
    if out is not None:
        inputs = [model]
        if not cfg.data.startswith(("builtin:", "hf:")):
            inputs.append(Path(cfg.data))
        check_destination(out, force, inputs)
    examples = load_data(
        cfg.data,
        text_column=cfg.text_column,
        require_labels=False,
        text_pair_column=cfg.text_pair_column,
    )
    if is_planning():  # uqc predict --dry-run: model and data checked, nothing predicted
        from uqcompress.engine.sources import peek_source

        peek_source(model, "model")
        raise PlannedPrediction(len(examples))
    source = open_source(
        model,
        "model",
        rank_device(cfg.device),
        cfg.threads,
        sample_chunk=cfg.sample_chunk,
        dtype=cfg.dtype,
    )
    source.workers = cfg.workers
    return write_predictions(source, examples, cfg.batch_size, cfg.max_length, out, sys.stdout)


def check_destination(out: Path, force: bool, inputs: list[Path] | None = None) -> None:
    """`--out FILE`: a file path, not a folder, not inside an artifact, not an input (the model,
    the --data file or folder); an existing file only with --force."""
    from uqcompress.artifacts.writer import is_uqc_manifest, refuse_output_over_inputs

    if out.is_dir():
        raise ConfigError(
            f"--out {out} is a folder; predict writes one JSONL file",
            hint="pass a file path, e.g. --out predictions.jsonl",
        )
    for parent in out.resolve().parents:
        if is_uqc_manifest(parent / MANIFEST_NAME):
            raise ArtifactError(
                f"--out {out} is inside the artifact {parent}; writing there would change an "
                "existing artifact",
                hint="choose an --out outside every artifact",
            )
    refuse_output_over_inputs(out, f"--out {out}", inputs or [])
    if out.exists() and not force:
        raise ArtifactError(
            f"--out {out} already exists", hint="pass --force to replace it, or another --out"
        )


def records(
    labels: list[str],
    start: int,
    probs: npt.NDArray[Any],
    entropy: npt.NDArray[Any],
    mutual_info: npt.NDArray[Any],
    abstain: npt.NDArray[np.bool_] | None,
) -> Iterator[str]:
    """The JSONL lines of examples `start, start + 1, ...`.

    Shape: probs `[n, C]`, entropy, mutual_info and abstain `[n]`.
    """
    for i in range(len(probs)):
        row = probs[i]
        record: dict[str, Any] = {
            "index": start + i,
            "label": labels[int(row.argmax())],
            "probs": {label: round(float(p), 7) for label, p in zip(labels, row, strict=True)},
            "entropy": round(float(entropy[i]), 7),
            "mutual_info": round(float(mutual_info[i]), 7),
        }
        if abstain is not None:
            record["abstain"] = bool(abstain[i])
        yield json.dumps(record) + "\n"


def write_predictions(
    source: Any,
    examples: Any,
    batch_size: int,
    max_length: int | None,
    out: Path | None,
    stdout: IO[str],
) -> int:
    """Predict every example and write its record, batch by batch; returns the number written
    (0 on the non-zero ranks of a multi-process launch, which write nothing).

    `out`: the JSONL file (built as a temporary file beside it, renamed when complete);
    None: `stdout`, after the last record (spooled through an anonymous temporary file).
    """
    from uqcompress.engine.sources import take
    from uqcompress.runtime.distributed import (
        agree,
        gather_objects,
        is_main_process,
        shard_bounds,
    )
    from uqcompress.uq.calibration import abstain_scores, abstains

    labels: list[str] = source.labels
    rule = source.calibration.abstain if source.calibration is not None else None
    start, stop = shard_bounds(len(examples))
    shard = take(examples, start, stop)
    main = is_main_process()
    sink: IO[str] | None = None
    partial: Path | None = None
    if main:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            from uqcompress.artifacts.writer import sibling_temp_name

            partial = out.parent / sibling_temp_name(out.name, f".partial-{os.getpid()}")
            sink = partial.open("w", encoding="utf-8")
        else:
            sink = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115

    def predict_shard() -> Shard | None:
        """Rank 0 writes its records as each batch finishes; the others keep their outputs."""
        kept: list[Shard] = []
        index = start
        for batch in source.stream(shard, batch_size, max_length):
            abstain = (
                abstains(rule, abstain_scores(batch.probs, batch.entropy, batch.mutual_info))
                if rule is not None
                else None
            )
            if sink is not None:
                sink.writelines(
                    records(labels, index, batch.probs, batch.entropy, batch.mutual_info, abstain)
                )
            else:
                kept.append(Shard(index, batch.probs, batch.entropy, batch.mutual_info, abstain))
            index += len(batch.probs)
        if sink is not None or not kept:
            return None
        return Shard(
            start=start,
            probs=np.concatenate([k.probs for k in kept]),
            entropy=np.concatenate([k.entropy for k in kept]),
            mutual_info=np.concatenate([k.mutual_info for k in kept]),
            abstain=(
                None
                if rule is None
                else np.concatenate([k.abstain for k in kept if k.abstain is not None])
            ),
        )

    try:
        gathered = gather_objects(agree(predict_shard))
        if sink is None:
            return 0
        for part in gathered or []:
            if part is not None:
                sink.writelines(
                    records(
                        labels, part.start, part.probs, part.entropy, part.mutual_info, part.abstain
                    )
                )
        if partial is not None:
            sink.flush()
            os.fsync(sink.fileno())
            sink.close()
            assert out is not None
            os.replace(partial, out)
            partial = None
        else:
            sink.seek(0)
            shutil.copyfileobj(sink, stdout)
            stdout.flush()
    finally:
        try:
            if sink is not None:
                sink.close()  # flushing may fail again (a full disk, ulimit -f) ...
        finally:
            if partial is not None:  # ... and the partial file goes all the same
                partial.unlink(missing_ok=True)
    return len(examples)
