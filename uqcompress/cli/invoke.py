"""What every step command does once its flags are read: run the step through the registry,
show its tables on stderr, print its result on stdout, and judge it (eval --gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from uqcompress.steps.common import StepResult


def run_step(
    name: str, values: dict[str, Any], force: bool, json_out: bool, out: Path | None
) -> StepResult | None:
    """`uqc NAME`: the step run with option values by key (input paths already resolved from
    '-'); its artifact path (or JSON) on stdout; exit 3 if its verdict fails. A step that
    writes no artifact (predict) writes its own stdout; with --out, the file's path follows."""
    from uqcompress.cli.output import emit, emit_file
    from uqcompress.steps.registry import step

    spec = step(name)
    result = spec.execute({**values, "out": out}, force)
    if result is None:
        emit_file(out)
        return None
    show(name, values, result)
    emit(result, json_out)
    spec.verdict(result)
    return result


def show(name: str, values: dict[str, Any], result: StepResult) -> None:
    """The tables a step prints on stderr: an eval's metrics, a comparison."""
    from uqcompress.cli.tables import print_calibration, print_metrics

    if name == "eval":
        models = " + ".join(Path(p).name for p in values["models"])
        summary = result.artifact.manifest.summary
        print_metrics([(models, summary)], title=f"uqc eval: {values['data']}")
        print_calibration(summary)
    elif name == "compare":
        from uqcompress.steps.compare import load_table

        table = load_table(result.artifact.path)
        print_metrics(
            [(row["model"], row) for row in table["rows"]],
            title=f"uqc compare (latency ratio to {table['baseline']})",
            ratio=True,
        )
