"""`uqc eval`: accuracy, NLL, Brier, ECE, latency of a model or a deep ensemble."""

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
from uqcompress.errors import ConfigError


def evaluate(
    models: Annotated[
        list[str],
        typer.Argument(
            help="One model, or several for a deep ensemble ('-': read one path from stdin)."
        ),
    ],
    data: Annotated[
        str,
        typer.Option(
            "--data",
            help="Labelled data: builtin:NAME\\[@split], FILE.csv, a "
            "folder or hf:NAME\\[/CONFIG]@SPLIT.",
        ),
    ],
    ood: Annotated[
        list[str] | None,
        typer.Option(
            "--ood",
            help="Out-of-distribution data (repeatable), e.g. "
            "builtin:photo-patches; labels not needed. Adds ood.<set>.<score>.* metrics.",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            help="DIRECTOR students, MC Dropout models: samples per input (default: the stored S).",
            show_default=False,
        ),
    ] = None,
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
    gate: Annotated[
        str | None,
        typer.Option(
            "--gate",
            help='Quality bounds, e.g. "acc>=0.9,ece<=0.05": exit 3 if one '
            "fails (the artifact is still written).",
            show_default=False,
        ),
    ] = None,
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
    """Evaluate and write an eval artifact (metrics.json); prints a table on stderr. An
    ensemble (M > 1: several models, Hydra, SVE, DIRECTOR samples) also reports the test-set
    means of predictive entropy, aleatoric entropy and mutual information."""
    from uqcompress.cli.invoke import run_step

    if models.count("-") > 1:
        raise ConfigError("'-' can stand for only one model", hint="name the others by path")
    options = {
        "models": [resolve_input(m) for m in models],
        "data": data,
        "ood": ood,
        "samples": samples,
        "sample_chunk": sample_chunk,
        "gate": gate,
        "batch_size": batch_size,
        "max_length": max_length,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
        "device": device,
        "threads": threads,
        "workers": workers,
    }
    run_step("eval", options, force, json_out, out)
