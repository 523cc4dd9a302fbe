"""`uqc score`: attention-head importance as a scores artifact."""

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
    Seed,
    TextColumn,
    TextPairColumn,
    Threads,
    Workers,
    resolve_input,
)
from uqcompress.methods.scoring import registry as scorers

SEARCHING = ", ".join(scorers.searching())  # the scorers --ood and --ratio are for


def score(
    model: Annotated[str, typer.Argument(help="Model artifact or transformers dir ('-': stdin).")],
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help=scorers.method_help(),
        ),
    ] = "hies",
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help=f"Labelled calibration data ({', '.join(scorers.needing_data())}).",
            show_default=False,
        ),
    ] = None,
    calib_size: Annotated[
        int, typer.Option("--calib-size", help="Calibration examples (a seeded subset).")
    ] = 32,
    alpha: Annotated[
        float, typer.Option("--alpha", help="HIES weight of importance vs attention entropy.")
    ] = 0.5,
    his_abs: Annotated[
        str, typer.Option("--his-abs", help="HIES: |.| per sample (as defined) or per batch.")
    ] = "sample",
    norm_scope: Annotated[
        str, typer.Option("--norm-scope", help="HIES min-max scope: global or layer.")
    ] = "global",
    taylor_layer_l2: Annotated[
        bool, typer.Option("--taylor-layer-l2", help="Taylor: divide each layer by its L2 norm.")
    ] = False,
    taylor_minmax: Annotated[
        bool, typer.Option("--taylor-minmax", help="Taylor: then min-max over all heads.")
    ] = False,
    ood: Annotated[
        str | None,
        typer.Option(
            "--ood",
            help=f"{SEARCHING}: OOD data for the uncertainty objective (AUROC - NLL / ln C; ours).",
            show_default=False,
        ),
    ] = None,
    ratio: Annotated[
        float | None,
        typer.Option(
            "--ratio",
            help=f"{SEARCHING}: fraction of heads per layer to remove (the search keeps the rest).",
            show_default=False,
        ),
    ] = None,
    members: Annotated[
        int,
        typer.Option(
            "--members",
            help="Score sets, each on its own seeded calibration subset "
            "(seed + m), for M ensemble members.",
        ),
    ] = 1,
    calib_pool: Annotated[
        int | None,
        typer.Option(
            "--calib-pool",
            help="headmap: examples (a seeded subset of --data; default all of it) whose "
            "--calib-size lowest-loss ones are the calibration set, as HeadMap picks them. "
            "Needed with --members (member m draws its pool with seed + m).",
            show_default=False,
        ),
    ] = None,
    seed: Seed = 0,
    batch_size: BatchSize = 16,
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
    """Score every attention head ([L, H], higher = keep); pipe into uqc prune.

    A pruned model is scored for the heads it has now: H is its largest layer's head count,
    and a layer with fewer heads has NaN in the slots it lacks.
    """
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "method": method,
        "data": data,
        "calib_size": calib_size,
        "alpha": alpha,
        "his_abs": his_abs,
        "norm_scope": norm_scope,
        "taylor_layer_l2": taylor_layer_l2,
        "taylor_minmax": taylor_minmax,
        "ood": ood,
        "ratio": ratio,
        "members": members,
        "calib_pool": calib_pool,
        "seed": seed,
        "batch_size": batch_size,
        "max_length": max_length,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
        "device": device,
        "threads": threads,
        "workers": workers,
    }
    run_step("score", options, force, json_out, out)
