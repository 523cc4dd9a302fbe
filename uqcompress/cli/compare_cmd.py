"""`uqc compare`: eval artifacts side by side (table, Markdown, CSV, JSON, one figure)."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Force, Json, Out, resolve_input


def compare(
    evals: Annotated[
        list[str],
        typer.Argument(metavar="EVAL...", help="Eval artifacts (uqc eval) of the same test data."),
    ],
    baseline: Annotated[
        int, typer.Option("--baseline", help="Which EVAL (0-based) latency ratios are to.")
    ] = 0,
    names: Annotated[
        str | None,
        typer.Option(
            "--names",
            help="Row names, comma-separated (default: each model's directory name).",
            show_default=False,
        ),
    ] = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Compare evaluations: accuracy, NLL, ECE, Brier, AURC, an ensemble's mean entropy,
    aleatoric entropy and MI, OOD AUROC/FPR95/AUPR, parameters, latency and its ratio to a
    baseline. Prints the table on stderr; the artifact holds
    comparison.md / .csv / .json and comparison.png (reliability and OOD histograms)."""
    from uqcompress.cli.invoke import run_step

    options = {
        "evals": [resolve_input(e) for e in evals],
        "baseline": baseline,
        "names": names,
    }
    run_step("compare", options, force, json_out, out)
