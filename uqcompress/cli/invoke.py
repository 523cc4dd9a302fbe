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


def plan_step(
    name: str, values: dict[str, Any], force: bool, json_out: bool, out: Path | None
) -> None:
    """`uqc NAME --dry-run`: the step checks its inputs and options and computes its id, then
    stops where work would start. stderr: the plan and the resolved config; stdout: the path
    it would write (as `uqc run --dry-run` prints its last step's), or the plan as JSON.
    Nothing is written, built or downloaded."""
    import json
    import sys

    from uqcompress.runtime.console import stderr, user
    from uqcompress.steps.registry import step

    spec = step(name)
    inputs, cfg, out_path = spec.prepare({**values, "out": out})
    plan = spec.plan(inputs, cfg, out_path, force)
    if plan.kind == "predictions":  # predict: a file or stdout, not an artifact
        where = user(plan.dest) if plan.dest is not None else "stdout"
        stderr.print(
            f"plan: uqc {name} would write {plan.examples} records to {where}", highlight=False
        )
    else:
        verb = "reuse" if plan.reusable else "build"
        stderr.print(
            f"plan: uqc {name} would {verb} {plan.kind} {plan.id[:8]} at {user(plan.dest)}",
            highlight=False,
        )
    for key, value in plan.config.items():
        stderr.print(f"  {key} = {user(json.dumps(value))}", highlight=False)
    if json_out:
        payload = {
            "step": name,
            "would": "write" if plan.kind == "predictions" else verb,
            "path": None if plan.dest is None else str(plan.dest),
            "kind": plan.kind,
            "id": plan.id or None,
            "examples": plan.examples,
            "config": plan.config,
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    elif plan.dest is not None:
        sys.stdout.write(f"{plan.dest}\n")
    sys.stdout.flush()
