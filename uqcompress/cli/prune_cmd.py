"""`uqc prune`: remove heads physically (smaller Q/K/V/O)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Out, Threads, resolve_input, setup_compute


def prune(
    input_: Annotated[
        str,
        typer.Argument(
            metavar="INPUT",
            help="A scores artifact (its model is found through its lineage), or a "
            "model with --scores ('-': stdin).",
        ),
    ],
    ratio: Annotated[float, typer.Option("--ratio", help="Fraction of heads to remove, [0, 1).")],
    scores: Annotated[
        Path | None,
        typer.Option(
            "--scores", help="Scores artifact, when INPUT is a model.", show_default=False
        ),
    ] = None,
    scope: Annotated[
        str,
        typer.Option(
            "--scope",
            help="layer (the same share per layer) or global "
            "(lowest scores anywhere; uneven heads per layer).",
        ),
    ] = "layer",
    min_heads_per_layer: Annotated[
        int,
        typer.Option(
            "--min-heads-per-layer", help="Heads every layer keeps (0 allows empty layers)."
        ),
    ] = 1,
    device: Device = "cpu",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Prune attention heads; writes a smaller model artifact that eval/finetune/export take."""
    from uqcompress.cli.output import emit
    from uqcompress.steps import prune as step

    input_path = resolve_input(input_)
    resolved_device, resolved_threads = setup_compute(device, threads)
    cfg = step.PruneConfig(
        ratio=ratio,
        scope=scope,
        min_heads_per_layer=min_heads_per_layer,
        device=resolved_device,
        threads=resolved_threads,
    )
    emit(step.run(input_path, cfg, scores, out, force), json_out)
