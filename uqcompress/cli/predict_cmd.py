"""`uqc predict`: one JSON object per example (JSONL), on stdout or into --out FILE."""

from __future__ import annotations

from pathlib import Path
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
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the JSONL to this file (built beside it batch by batch, renamed into "
            "place when complete) and print its path, instead of the JSONL on stdout.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
    device: Device = "cpu",
    threads: Threads = None,
    workers: Workers = 0,
) -> None:
    """Predict: label, probs (by label), entropy and mutual_info per example, as JSONL.

    ONNX artifacts run on the torch-free ONNX Runtime Predictor; models run in torch. A model
    calibrated with an abstention rule (uqc calibrate --abstain-coverage) adds
    "abstain": true|false. Records are written batch by batch (memory does not grow with the
    number of examples) and appear only when all are written: nothing on a failure. Under
    torchrun each process predicts a shard; the first writes every record, in order.
    """
    import sys

    from uqcompress.data import load_data
    from uqcompress.export.source import open_source
    from uqcompress.runtime.distributed import is_main_process, rank_device
    from uqcompress.steps.predict import check_destination, write_predictions

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
    from uqcompress.runtime.limits import over_limit

    # predict has no step config: the same bounds as every step's, checked here
    counts = {
        "batch_size": batch_size,
        "workers": workers,
        "sample_chunk": sample_chunk,
        "max_length": max_length,
    }
    for name, value in counts.items():
        too_many = over_limit(name, value, "--" + name.replace("_", "-"))
        if too_many is not None:
            from uqcompress.errors import ConfigError

            raise ConfigError(too_many[0], hint=too_many[1])
    model_path = resolve_input(model)
    if out is not None:
        inputs = [model_path]
        if not data.startswith(("builtin:", "hf:")):
            inputs.append(Path(data))
        check_destination(out, force, inputs)
    resolved_device, resolved_threads = setup_compute(device, threads)
    examples = load_data(
        data, text_column=text_column, require_labels=False, text_pair_column=text_pair_column
    )
    source = open_source(
        model_path,
        "model",
        rank_device(resolved_device),
        resolved_threads,
        sample_chunk=sample_chunk,
    )
    source.workers = workers
    write_predictions(source, examples, batch_size, max_length, out, sys.stdout)
    if out is not None and is_main_process():  # the result on stdout: the file written
        sys.stdout.write(f"{out}\n")
