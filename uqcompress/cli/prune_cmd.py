"""`uqc prune`: remove heads physically (smaller Q/K/V/O)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Out, Threads, resolve_input


def prune(
    input_: Annotated[
        str,
        typer.Argument(
            metavar="INPUT",
            help="A scores artifact (its model is found through its lineage), or a "
            "model with --scores ('-': stdin).",
        ),
    ],
    ratio: Annotated[
        float | None,
        typer.Option(
            "--ratio",
            help="Fraction of heads to remove, [0, 1). Required for one "
            "model; with --members the default keeps max(1, round(H/M)) heads per "
            "layer in each member. Circuit scores need the ratio they were searched for.",
            show_default=False,
        ),
    ] = None,
    scores: Annotated[
        Path | None,
        typer.Option(
            "--scores", help="Scores artifact, when INPUT is a model.", show_default=False
        ),
    ] = None,
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope",
            help="global (the lowest scores anywhere go, uneven heads per layer: HIES's and "
            "Michel et al.'s selection) or layer (the same share per layer). Default: global "
            "for one model, layer for --members; searched circuits (headmap, greedy-circuit) "
            "are kept as searched.",
            show_default=False,
        ),
    ] = None,
    min_heads_per_layer: Annotated[
        int,
        typer.Option(
            "--min-heads-per-layer", help="Heads every layer keeps (0 allows empty layers)."
        ),
    ] = 1,
    members: Annotated[
        int,
        typer.Option(
            "--members",
            help="Differently-pruned members to produce (an ensemble); writes a members artifact.",
        ),
    ] = 1,
    select: Annotated[
        str,
        typer.Option(
            "--select",
            help="Members: topk (score set m for member m; needs "
            "uqc score --members M), gumbel (Gumbel-top-k sampling from one ranking) "
            "or partition (ranked heads dealt round-robin: no shared head). gumbel and "
            "partition rank by the mean of all score sets when given several. Circuit "
            "scores (headmap, greedy-circuit) take topk only: member m keeps circuit m "
            "as searched.",
        ),
    ] = "topk",
    unit: Annotated[
        str,
        typer.Option(
            "--unit",
            help="Grouped-query attention (decoders): query (remove tiers of query heads, so "
            "every key/value head keeps as many query heads as the others) or kv (remove "
            "whole key/value heads with their query heads). Ignored without GQA.",
        ),
    ] = "query",
    seed: Annotated[int, typer.Option("--seed", help="Seed of --select gumbel.")] = 0,
    device: Device = "cpu",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Prune attention heads; writes a smaller model artifact that eval/finetune/export take."""
    from uqcompress.cli.invoke import run_step

    options = {
        "input": resolve_input(input_),
        "ratio": ratio,
        "scores": scores,
        "scope": scope,
        "min_heads_per_layer": min_heads_per_layer,
        "members": members,
        "select": select,
        "unit": unit,
        "seed": seed,
        "device": device,
        "threads": threads,
    }
    run_step("prune", options, force, json_out, out)
