"""`uqc calibrate`: temperature scaling and an abstention threshold, as a new model artifact."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import (
    BatchSize,
    Device,
    Force,
    Json,
    LabelColumn,
    MaxLength,
    Out,
    TextColumn,
    TextPairColumn,
    Threads,
    Workers,
    resolve_input,
)


def calibrate(
    model: Annotated[str, typer.Argument(help="Model artifact or transformers dir ('-': stdin).")],
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Held-out labelled data (not the training data): builtin:NAME\\[@split], "
            "FILE.csv, a folder or hf:NAME\\[/CONFIG]@SPLIT.",
        ),
    ],
    abstain_coverage: Annotated[
        float | None,
        typer.Option(
            "--abstain-coverage",
            help="Also fit an uncertainty threshold that answers this fraction of --data, "
            "e.g. 0.9; predict and the Predictor then return abstain: true|false.",
            show_default=False,
        ),
    ] = None,
    abstain_score: Annotated[
        str,
        typer.Option(
            "--abstain-score",
            help="Uncertainty the threshold applies to: msp (1 - max probability), entropy, "
            "or mi (ensembles).",
        ),
    ] = "msp",
    batch_size: BatchSize = 64,
    max_length: MaxLength = None,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    text_pair_column: TextPairColumn = None,
    device: Device = "auto",
    threads: Threads = None,
    workers: Workers = 0,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Fit a temperature (every member's logits / T, T minimising the NLL of the averaged
    probabilities by L-BFGS) and write a new model artifact that eval, export (in the graph),
    predict and the Predictor apply. Reports NLL and ECE before/after."""
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "data": data,
        "abstain_coverage": abstain_coverage,
        "abstain_score": abstain_score,
        "batch_size": batch_size,
        "max_length": max_length,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
        "device": device,
        "threads": threads,
        "workers": workers,
    }
    run_step("calibrate", options, force, json_out, out)
