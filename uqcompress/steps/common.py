"""What every step shares: reuse-or-build around the atomic writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import (
    MANIFEST_NAME,
    Artifact,
    ArtifactWriter,
    OutputPlan,
    clean_stale_temp_dirs,
    resolve_destination,
)
from uqcompress.artifacts.writer import destination_path, is_uqc_manifest
from uqcompress.errors import ArtifactError
from uqcompress.runtime.console import stderr
from uqcompress.runtime.distributed import is_main_process
from uqcompress.runtime.planning import PlannedStep, is_planning


def _refuse_unsafe_destination(dest: Path, out_given: bool, plan: OutputPlan) -> None:
    """Steps never edit an artifact other than their own output, nor the folder the user
    works in: the destination may not be an input, inside one or contain one; nor inside any
    other artifact (writing there adds files its manifest does not list, so it no longer
    verifies); nor the working directory or a folder above it (the final rename cannot
    replace those). A destination that contains an artifact is refused by
    `resolve_destination`, which never replaces a folder holding files it does not own."""
    what = f"--out {dest}" if out_given else f"the output folder {dest}"
    target = dest.resolve()
    for ref in plan.inputs:
        source = ref.path.resolve()
        if target == source or source in target.parents or target in source.parents:
            raise ArtifactError(
                f"{what} overlaps the input {ref.path}; steps never modify their inputs",
                hint="choose an --out outside the input artifacts",
            )
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working directory was deleted: nothing of it left to protect
        cwd = None
    if cwd is not None and (target == cwd or target in cwd.parents):
        raise ArtifactError(
            f"{what} is the working directory or a folder that contains it; a step writes a "
            "new folder and never replaces the one you are in",
            hint="choose a new folder, e.g. --out artifacts/NAME",
        )
    for parent in target.parents:
        if is_uqc_manifest(parent / MANIFEST_NAME):
            raise ArtifactError(
                f"{what} is inside the artifact {parent}; writing there would change an "
                "existing artifact",
                hint="choose an --out outside every artifact",
            )


@dataclass(frozen=True)
class StepResult:
    artifact: Artifact
    reused: bool


def build_or_reuse(
    plan: OutputPlan,
    out: Path | None,
    force: bool,
    build: Callable[[ArtifactWriter], None],
) -> StepResult:
    """Reuse an artifact with the same id at the destination, else build it atomically."""
    _refuse_unsafe_destination(destination_path(plan, out), out is not None, plan)
    dest, existing = resolve_destination(plan, out, force)
    if is_planning():
        raise PlannedStep(dest, existing is not None, plan.kind, plan.id)
    if existing is not None:
        stderr.print(f"[dim]{dest}: same inputs and config as before, reusing it[/dim]")
        return StepResult(artifact=existing, reused=True)
    # Temp dirs of killed processes (their pid is gone) would otherwise pile up here.
    clean_stale_temp_dirs(dest.parent)
    # In a multi-process launch every rank computes (training needs them all); only rank 0
    # installs the artifact.
    with ArtifactWriter(dest, plan, force=force, discard=not is_main_process()) as writer:
        build(writer)
    return StepResult(artifact=writer.artifact, reused=False)


@dataclass(frozen=True)
class TrainingData:
    """What every training step reads: training and optional validation data, and their
    manifest entries (whose content fingerprints go into the artifact id)."""

    train: Any
    val: Any | None
    entries: list[dict[str, Any]]


def load_training_data(
    data: str, val: str | None, text_column: str, label_column: str
) -> TrainingData:
    """Load `--data` and `--val` (labels required) before any model work, so bad data fails
    first."""
    from uqcompress.data import load_data

    train = load_data(data, text_column, label_column)
    validation = load_data(val, text_column, label_column) if val else None
    entries = [train.manifest_entry("train")]
    if validation is not None:
        entries.append(validation.manifest_entry("val"))
    return TrainingData(train=train, val=validation, entries=entries)


def train_into(
    source: Any,
    train_cfg: Any,
    train_data: Any,
    val_data: Any,
    directory: Path,
    *,
    max_length: int | None,
    transform: Callable[[Any], Any] | None = None,
    description: str = "finetune",
) -> tuple[dict[str, Any], list[str]]:
    """Load the model of `source`, fine-tune it (`train.fine_tune`, `transform` included) and
    save it into `directory`; returns the summary and the warnings for its manifest."""
    from uqcompress.data.encoding import check_input_kind
    from uqcompress.engine.train import fine_tune
    from uqcompress.models.loading import calibration_dropped, load_model, save_model
    from uqcompress.steps.init import model_summary

    warnings: list[str] = []
    loaded = load_model(source)
    if (dropped := calibration_dropped(loaded, source.path)) is not None:
        warnings.append(dropped)
    for each in [train_data] + ([val_data] if val_data is not None else []):
        check_input_kind(each, loaded.input_kind, loaded.family.name)
    tuned = fine_tune(
        loaded,
        train_data,
        val_data,
        train_cfg,
        max_length=max_length,
        head_untrained=_head_is_untrained(source, loaded),
        source=str(source.path),
        transform=transform,
        description=description,
    )
    warnings += tuned.warnings
    save_model(tuned.loaded, directory)
    result = tuned.result
    summary = {**tuned.notes, **model_summary(tuned.loaded)}
    summary.update(
        {
            "trained": True,
            "epochs": train_cfg.epochs,
            "steps": result.steps,
            "train_examples": len(train_data),
            "train_seconds": round(result.seconds, 3),
            "loss_curve": [round(v, 6) for v in result.loss_curve],
        }
    )
    if result.val_curve:
        summary["val_acc_curve"] = [round(m["acc"], 6) for m in result.val_curve]
        summary["val_acc"] = round(result.val_curve[-1]["acc"], 6)
    return summary, warnings


def _head_is_untrained(source: Any, loaded: Any) -> bool:
    """The checkpoint had no classifier weights, now or when it was imported."""
    if loaded.new_head_keys:
        return True
    if source.is_artifact:
        from uqcompress.artifacts import read_manifest

        manifest = read_manifest(source.path)
        # Only an import records a head that was never trained; a finetune's flag says it
        # initialised one and then trained it.
        return manifest.step == "import" and bool(manifest.summary.get("classifier_initialised"))
    return False
