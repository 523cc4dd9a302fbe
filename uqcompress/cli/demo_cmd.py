"""`uqc demo`: the whole pipeline on scikit-learn's digits, with a table at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Threads, setup_compute


def demo(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Directory for the demo's artifacts. Default: "
            "artifacts/demo (artifacts/demo-quick with --quick).",
            show_default=False,
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny ViT, 2 epochs: checks the wiring in seconds.")
    ] = False,
    device: Device = "auto",
    threads: Threads = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """init a ViT, finetune it on builtin:digits, eval on builtin:digits@test, print a table.

    Re-running reuses finished artifacts (same ids); --force redoes everything.
    """
    import time

    from uqcompress.artifacts import default_root
    from uqcompress.cli.output import emit
    from uqcompress.cli.tables import print_metrics
    from uqcompress.console import stderr
    from uqcompress.errors import QualityGateError
    from uqcompress.steps import demo as step

    start = time.perf_counter()
    resolved_device, resolved_threads = setup_compute(device, threads)
    root = out if out is not None else default_root() / ("demo-quick" if quick else "demo")
    result = step.run(root, quick, resolved_device, resolved_threads, force)
    summary = result.evaluation.artifact.manifest.summary
    train = result.finetune.artifact.manifest.summary
    print_metrics(
        [(f"ViT-{result.plan.preset} ({result.plan.epochs} epochs)", summary)],
        title="uqc demo: builtin:digits@test",
    )
    stderr.print(
        f"trained in {train.get('train_seconds', 0):.1f} s on {resolved_device}, "
        f"val acc {train.get('val_acc', float('nan')):.4f}; "
        f"demo took {time.perf_counter() - start:.1f} s. Artifacts in {root}"
    )
    emit(result.evaluation, json_out)
    if not quick and summary["acc"] < step.ACCURACY_BAR:
        raise QualityGateError(
            f"demo test accuracy {summary['acc']:.4f} is below its bar {step.ACCURACY_BAR}",
            hint="this is a bug in uqc; please report it with the eval artifact",
        )
