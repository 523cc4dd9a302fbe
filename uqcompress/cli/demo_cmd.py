"""`uqc demo`: the whole pipeline on scikit-learn's digits, with a table at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Quiet, Threads, Verbose, setup_compute


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
        bool, typer.Option("--quick", help="Tiny ViTs, 2 epochs: checks the wiring quickly.")
    ] = False,
    device: Device = "auto",
    threads: Threads = None,
    force: Force = False,
    json_out: Json = False,
    verbose: Verbose = False,
    quiet: Quiet = False,
) -> None:
    """Train 3 ViTs on digits; export, prune, ensemble and fuse them; compare in one table.

    Evaluates on builtin:digits@test with builtin:photo-patches as OOD data and prints a
    table; stdout carries the path of the exported ONNX artifact. Re-running reuses finished
    artifacts (same ids); --force redoes everything.
    """
    import time

    from uqcompress.artifacts import default_root
    from uqcompress.cli.output import emit
    from uqcompress.cli.tables import print_metrics
    from uqcompress.errors import QualityGateError
    from uqcompress.runtime.console import stderr
    from uqcompress.steps import demo as step

    start = time.perf_counter()
    resolved_device, resolved_threads = setup_compute(device, threads)
    root = out if out is not None else default_root() / ("demo-quick" if quick else "demo")
    result = step.run(root, quick, resolved_device, resolved_threads, force, adopt=out is None)
    from uqcompress.steps.compare import load_table

    table = load_table(result.comparison.artifact.path)
    print_metrics(
        [(row.name, record) for row, record in zip(result.rows, table["rows"], strict=True)],
        title=f"uqc demo: {step.TEST}, OOD = {step.OOD} (x base: latency / the first row's)",
        ratio=True,
    )
    seconds = [m.artifact.manifest.summary.get("train_seconds", 0.0) for m in result.models]
    parity = result.onnx.artifact.manifest.summary
    hydra_parity = result.hydra_onnx.artifact.manifest.summary
    stderr.print(
        f"{len(seconds)} ViTs trained in {sum(seconds):.1f} s on {resolved_device}; ONNX parity "
        f"max |probs diff| {parity['parity_max_abs_probs']:.1e} (Hydra "
        f"{hydra_parity['parity_max_abs_probs']:.1e}) over {parity['parity_examples']} "
        f"examples; demo took {time.perf_counter() - start:.1f} s. Artifacts in {root}"
    )
    emit(result.onnx, json_out)
    accuracy = result.single.evaluation.artifact.manifest.summary["acc"]
    if not quick and accuracy < step.ACCURACY_BAR:
        raise QualityGateError(
            f"demo test accuracy {accuracy:.4f} is below its bar {step.ACCURACY_BAR}",
            hint="this is a bug in uqc; please report it with the eval artifact",
        )
