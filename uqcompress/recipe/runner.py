"""Run a checked recipe like a build tool: each step in order, reusing finished artifacts.

Every step runs through the step registry (`steps/registry.py`), in this process, as its
`uqc` command would. A step's artifact id is a hash of its config, inputs and data, and
artifacts without `out` go to `<artifacts>/<kind>-<id8>`, so a step whose inputs and options
did not change finds its artifact and skips the work; a changed step (and everything after
it) gets new ids. A failed step stops the run naming the step; finished artifacts stay, so
the next run resumes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqcompress.errors import ConfigError, QualityGateError, UqcError
from uqcompress.recipe.commands import command
from uqcompress.recipe.parse import Recipe, Ref, Step
from uqcompress.steps.common import StepResult
from uqcompress.steps.registry import step as registered

REUSED, BUILT, WOULD_REUSE, WOULD_BUILD = "reused", "built", "would reuse", "would build"


@dataclass
class StepOutcome:
    name: str
    command: str
    status: str  # REUSED, BUILT, WOULD_REUSE or WOULD_BUILD
    path: Path | None = None
    kind: str | None = None
    id: str | None = None
    seconds: float = 0.0
    argv: list[str] = field(default_factory=list)  # the `uqc` command line the step equals

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "status": self.status,
            "path": None if self.path is None else str(self.path),
            "kind": self.kind,
            "id": self.id,
            "seconds": round(self.seconds, 3),
            "argv": self.argv,
        }


@dataclass
class RunReport:
    recipe: Path
    steps: list[StepOutcome]
    gate: dict[str, Any] | None = None  # evaluate_gate's verdict, plus step and metric values
    # the step that failed: its name, command, the error line, its fix and exit code
    failed: dict[str, Any] | None = None

    @property
    def last_path(self) -> Path | None:
        return self.steps[-1].path if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": str(self.recipe),
            "path": None if self.last_path is None else str(self.last_path),
            "steps": {s.name: s.to_dict() for s in self.steps},
            "gate": self.gate,
            "failed": self.failed,
        }


class StepFailed(UqcError):
    """A step's own error, prefixed with the step's name; keeps the step's exit code."""

    def __init__(self, step: Step, exc: UqcError) -> None:
        hint = (exc.hint + "; " if exc.hint else "") + (
            "finished steps are kept, so rerunning the recipe resumes here"
        )
        super().__init__(f"step {step.name!r} (uqc {step.command}) failed: {exc.message}", hint)
        self.exit_code = exc.exit_code
        self.step = step
        self.report: RunReport | None = None  # the steps that ran before (uqc run --json)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step.name,
            "command": self.step.command,
            "error": self.message,
            "fix": self.hint,
            "exit_code": self.exit_code,
        }


def run_recipe(
    recipe: Recipe,
    dry_run: bool = False,
    force: bool = False,
    root: Path | None = None,
    show: Callable[[str, dict[str, Any], StepResult], None] | None = None,
) -> RunReport:
    """Run (or, with `dry_run`, plan) every step; then check the gate. `root`: where steps
    without `out` write (default: $UQC_ARTIFACTS or ./artifacts); `show(command, values, result)`
    is called after each step that ran (the CLI prints an eval's metrics). A failed step's
    `StepFailed` carries the report so far, its `failed` entry naming the step."""
    report = RunReport(recipe=recipe.path, steps=[])
    outcomes: dict[str, StepOutcome] = {}
    try:
        for index, step in enumerate(recipe.steps, start=1):
            _run_one(recipe, step, index, report, outcomes, dry_run, force, root, show)
    except StepFailed as exc:
        report.failed = exc.to_dict()
        exc.report = report  # the CLI still prints the report (--json) before exiting
        raise
    if recipe.gate is not None and not dry_run:
        try:
            report.gate = check_gate(recipe, outcomes)
        except GateFailed as exc:
            report.gate = exc.verdict
            exc.report = report  # the CLI still prints the paths before exiting 3
            raise
    return report


def _run_one(
    recipe: Recipe,
    step: Step,
    index: int,
    report: RunReport,
    outcomes: dict[str, StepOutcome],
    dry_run: bool,
    force: bool,
    root: Path | None,
    show: Callable[[str, dict[str, Any], StepResult], None] | None,
) -> None:
    """Run (or plan) one step, its outcome added to `outcomes` and the report."""
    from uqcompress.runtime.console import stderr

    total = len(recipe.steps)
    # inputs a dry run would build first: this step cannot be planned from them yet
    pending = [n for n in step.needs if outcomes[n].status == WOULD_BUILD]
    values = {k: _resolve(v, outcomes) for k, v in step.values.items()}
    head = f"[bold][{index}/{total}] {step.name}[/bold] (uqc {step.command})"
    if dry_run:
        outcome = _plan(step, values, pending, force, root)
        where = (
            f" -> {outcome.path}"
            if not pending
            else f" (its input from {', '.join(pending)} would be built first)"
        )
        stderr.print(f"{head}: {outcome.status}{where}", highlight=False)
    else:
        stderr.print(f"{head}", highlight=False)
        try:
            outcome = _execute(step, values, force, root, show)
        except KeyboardInterrupt:
            stderr.print(
                f"interrupted in step {step.name!r}: the {index - 1} finished steps are "
                "kept; rerun the recipe to resume",
                highlight=False,
            )
            raise
        stderr.print(
            f"[dim]{step.name}: {outcome.status} {outcome.path} ({outcome.seconds:.1f} s)[/dim]",
            highlight=False,
        )
    outcomes[step.name] = outcome
    report.steps.append(outcome)


def _resolve(value: Any, outcomes: dict[str, StepOutcome]) -> Any:
    if isinstance(value, list):
        return [_resolve(v, outcomes) for v in value]
    if isinstance(value, Ref):
        return str(outcomes[value.step].path)
    return value


def _argv(step: Step, values: dict[str, Any], force: bool) -> list[str]:
    """The `uqc` command line the step equals (`--force` right after the command's name:
    before the `--` that ends its options)."""
    argv = command(step.command).argv(values)
    return [argv[0], *(["--force"] if force else []), *argv[1:]]


def _execute(
    step: Step,
    values: dict[str, Any],
    force: bool,
    root: Path | None,
    show: Callable[[str, dict[str, Any], StepResult], None] | None,
) -> StepOutcome:
    from uqcompress.runtime import interrupts
    from uqcompress.runtime.distributed import is_main_process

    spec = registered(step.command)
    start = time.perf_counter()
    try:
        result = spec.execute(values, force, root)
        assert result is not None, "a recipe step writes an artifact (STEP_COMMANDS)"
        if not is_main_process():  # (it took part in the step: training needs every rank)
            raise UqcError(
                "has no result in this process: only the first process of a multi-process "
                "launch writes artifacts",
                hint="run uqc run as one process (not under torchrun)",
            )
        interrupts.check()  # an interrupted step reports no result, even a reused artifact
        if show is not None:
            show(step.command, values, result)
        spec.verdict(result)  # eval --gate: exit 3, the artifact written
    except UqcError as exc:
        raise StepFailed(step, exc) from exc
    return StepOutcome(
        name=step.name,
        command=step.command,
        status=REUSED if result.reused else BUILT,
        path=result.artifact.path,
        kind=result.artifact.kind,
        id=result.artifact.id,
        seconds=time.perf_counter() - start,
        argv=_argv(step, values, force),
    )


def _plan(
    step: Step, values: dict[str, Any], pending: list[str], force: bool, root: Path | None
) -> StepOutcome:
    """Where the step's artifact would go, and whether it is there already."""
    outcome = StepOutcome(name=step.name, command=step.command, status=WOULD_BUILD)
    if pending:  # an input that does not exist yet: this step will build too
        return outcome
    outcome.argv = _argv(step, values, force)
    spec = registered(step.command)
    try:
        inputs, cfg, out = spec.prepare(values)
        planned = spec.plan(inputs, cfg, out, force, root)
    except UqcError as exc:
        raise StepFailed(step, exc) from exc
    outcome.status = WOULD_REUSE if planned.reusable else WOULD_BUILD
    outcome.path, outcome.kind, outcome.id = planned.dest, planned.kind, planned.id
    return outcome


def check_gate(recipe: Recipe, outcomes: dict[str, StepOutcome]) -> dict[str, Any]:
    """Bounds of the [gate] table over the gated eval's metrics; exit 3 when one fails."""
    from uqcompress.artifacts import open_artifact
    from uqcompress.uq.quality_gates import describe_failures, evaluate_gate

    gate = recipe.gate
    assert gate is not None
    gated = outcomes[gate.step]
    assert gated.path is not None
    metrics: dict[str, Any] = dict(open_artifact(gated.path, expect_kind="eval").manifest.summary)
    wanted = {b.metric for b in gate.bounds}
    if gate.baseline is not None and wanted & {"params_ratio", "flops_ratio"}:
        baseline = outcomes[gate.baseline]
        assert baseline.path is not None
        base_summary = open_artifact(baseline.path, expect_kind="eval").manifest.summary
        if not base_summary.get("parameters") or not metrics.get("parameters"):
            raise ConfigError(
                f"gate: eval steps {gate.step!r} and {gate.baseline!r} must both report "
                "parameters for params_ratio",
                hint="gate ratios between evals of uqc models",
            )
        metrics["params_ratio"] = metrics["parameters"] / base_summary["parameters"]
        if "flops_ratio" in wanted:
            from uqcompress.engine.flops import eval_flops

            metrics["flops_ratio"] = eval_flops(gated.path) / eval_flops(baseline.path)
    missing = sorted(m for m in wanted if metrics.get(m) is None)
    if missing:
        raise ConfigError(
            f"gate: eval step {gate.step!r} did not report {', '.join(missing)} (entropy, "
            "aleatoric, mi and disagreement need an ensemble; the calibration metrics a "
            "calibrated model)",
            hint="bound metrics this model has, or gate another eval step (gate.step)",
        )
    verdict = evaluate_gate(gate.bounds, metrics)
    verdict["step"] = gate.step
    verdict["values"] = {m: metrics[m] for m in sorted(wanted)}
    if not verdict["passed"]:
        raise GateFailed(verdict, describe_failures(verdict))
    return verdict


class GateFailed(QualityGateError):
    """The recipe's gate failed; the artifacts are all written."""

    def __init__(self, verdict: dict[str, Any], described: str) -> None:
        super().__init__(
            f"quality gate failed on step {verdict['step']!r}: {described}",
            hint="the artifacts are written (see uqc inspect); revisit the recipe or the bound",
        )
        self.verdict = verdict
        self.report: RunReport | None = None
