"""`uqc run`: a recipe's steps in order, reusing finished artifacts; gates exit 3."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uqcompress.cli.options import Json, Quiet, Verbose


def run_recipe(
    recipe: Annotated[
        Path, typer.Argument(help="A recipe file, e.g. recipes/hydra-vit-digits.toml.")
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a recipe value (repeatable): vars.NAME=V, steps.STEP.OPTION=V or "
            "gate.METRIC='>= 0.9'.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Check the recipe and print the plan: each step's artifact and whether it "
            "would be reused or built. Runs nothing.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild every step, replacing finished artifacts.")
    ] = False,
    artifacts: Annotated[
        Path | None,
        typer.Option(
            "--artifacts",
            help="Where steps without 'out' write: <DIR>/<kind>-<id8>. Default: "
            "$UQC_ARTIFACTS or ./artifacts.",
            show_default=False,
        ),
    ] = None,
    json_out: Json = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Run a recipe: every step in order, reusing any artifact with the same id (a rerun of
    an unchanged recipe does no work; a failed or interrupted run resumes), then check its
    [gate] (exit 3 naming the failing bound). stdout: the last step's artifact path (--json:
    the report, with the failed step and its error when one fails)."""
    import json
    import sys

    from uqcompress.cli.invoke import show
    from uqcompress.recipe.parse import load_recipe
    from uqcompress.recipe.runner import (
        BUILT,
        REUSED,
        WOULD_REUSE,
        GateFailed,
        RunReport,
        StepFailed,
    )
    from uqcompress.recipe.runner import run_recipe as execute
    from uqcompress.runtime.console import stderr, user

    checked = load_recipe(recipe, set_ or [])
    for line in checked.deprecations:
        stderr.print(
            f"[yellow]warning:[/yellow] recipe {user(recipe)} {user(line)}", highlight=False
        )
    failed: GateFailed | None = None
    report: RunReport | None
    try:
        report = execute(checked, dry_run=dry_run, force=force, root=artifacts, show=show)
    except GateFailed as exc:
        failed = exc
        report = exc.report
    except StepFailed as exc:
        # --json: the steps that ran and the failure (step, error line, fix, exit code)
        if json_out and exc.report is not None:
            sys.stdout.write(json.dumps(exc.report.to_dict(), indent=2) + "\n")
            sys.stdout.flush()
        raise
    assert isinstance(report, RunReport)
    counts = {s: sum(o.status == s for o in report.steps) for s in (BUILT, REUSED, WOULD_REUSE)}
    if dry_run:
        stderr.print(
            f"plan: {len(report.steps)} steps, {counts[WOULD_REUSE]} would be reused, "
            f"{len(report.steps) - counts[WOULD_REUSE]} would be built",
            highlight=False,
        )
    else:
        stderr.print(
            f"{len(report.steps)} steps: {counts[BUILT]} built, {counts[REUSED]} reused",
            highlight=False,
        )
        if report.gate is not None and report.gate["passed"]:
            stderr.print(f"[green]gate passed[/green]: {user(report.gate['expression'])}")
    if json_out:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    elif report.last_path is not None:
        sys.stdout.write(f"{report.last_path}\n")
    sys.stdout.flush()
    if failed is not None:
        raise failed
