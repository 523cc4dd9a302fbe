"""`uqc predict`: one JSON object per example on stdout (JSONL)."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import (
    BatchSize,
    Device,
    MaxLength,
    TextColumn,
    TextPairColumn,
    Threads,
    Workers,
    resolve_input,
    setup_compute,
)


def predict(
    model: Annotated[
        str, typer.Argument(help="Model artifact, transformers dir or ONNX artifact ('-': stdin).")
    ],
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Examples: builtin:NAME\\[@split], FILE.csv, a "
            "folder or hf:NAME\\[/CONFIG]@SPLIT (a label column is not needed).",
        ),
    ],
    batch_size: BatchSize = 64,
    max_length: MaxLength = None,
    text_column: TextColumn = "text",
    text_pair_column: TextPairColumn = None,
    sample_chunk: Annotated[
        int | None,
        typer.Option(
            "--sample-chunk",
            help="DIRECTOR students, MC Dropout models: samples run per pass (memory and "
            "speed only, the same "
            "result). Default: as many as fit 16384 tokens (sequences x length) per pass.",
            show_default=False,
        ),
    ] = None,
    device: Device = "cpu",
    threads: Threads = None,
    workers: Workers = 0,
) -> None:
    """Predict: label, probs (by label), entropy and mutual_info per example, as JSONL.

    ONNX artifacts run on the torch-free ONNX Runtime Predictor; models run in torch. A model
    calibrated with an abstention rule (uqc calibrate --abstain-coverage) adds
    "abstain": true|false.
    """
    import json
    import sys

    from uqcompress.data import load_data
    from uqcompress.steps.sources import open_source
    from uqcompress.uq.calibration import abstain_scores, abstains

    if sample_chunk is not None and sample_chunk < 1:
        from uqcompress.errors import ConfigError

        raise ConfigError(
            f"--sample-chunk {sample_chunk} must be at least 1",
            hint="drop --sample-chunk to size it to memory",
        )
    if workers < 0:
        from uqcompress.errors import ConfigError

        raise ConfigError(
            f"--workers {workers} must be 0 or more",
            hint="pass --workers 0 (read data in this process) or e.g. --workers 2",
        )
    model_path = resolve_input(model)
    resolved_device, resolved_threads = setup_compute(device, threads)
    examples = load_data(
        data, text_column=text_column, require_labels=False, text_pair_column=text_pair_column
    )
    source = open_source(
        model_path, "model", resolved_device, resolved_threads, sample_chunk=sample_chunk
    )
    source.workers = workers
    outputs = source.predict(examples, batch_size, max_length)
    labels = source.labels
    rule = source.calibration.abstain if source.calibration is not None else None
    abstain = (
        abstains(rule, abstain_scores(outputs.probs, outputs.entropy, outputs.mutual_info))
        if rule is not None
        else None
    )
    write = sys.stdout.write
    for i in range(len(examples)):
        probs = outputs.probs[i]
        record = {
            "index": i,
            "label": labels[int(probs.argmax())],
            "probs": {label: round(float(p), 7) for label, p in zip(labels, probs, strict=True)},
            "entropy": round(float(outputs.entropy[i]), 7),
            "mutual_info": round(float(outputs.mutual_info[i]), 7),
        }
        if abstain is not None:
            record["abstain"] = bool(abstain[i])
        write(json.dumps(record) + "\n")
    sys.stdout.flush()
