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
from uqcompress.artifacts.writer import (
    destination_path,
    is_uqc_manifest,
    local_data_paths,
    refuse_output_over_inputs,
    sibling_temp_name,
)
from uqcompress.errors import ArtifactError
from uqcompress.runtime.console import detail, phase, stderr, user
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
    refuse_output_over_inputs(dest, what, local_data_paths(plan.data))
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


def with_planned_dtype(cfg: Any, source: Any) -> Any:
    """`cfg` with its `--dtype` as the step will load `source` (`auto` resolved), so that the
    recorded config and the artifact id say which dtype it computed in."""
    from dataclasses import replace

    from uqcompress.models.loading import planned_dtype

    return replace(cfg, dtype=planned_dtype(source, cfg.dtype))


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
        raise PlannedStep(dest, existing is not None, plan.kind, plan.id, plan.config)
    if existing is not None:
        stderr.print(f"[dim]{user(dest)}: same inputs and config as before, reusing it[/dim]")
        return StepResult(artifact=existing, reused=True)
    detail(f"building {plan.kind} {plan.id[:8]} at {user(dest)}")
    # Temp dirs of killed processes (their pid is gone) would otherwise pile up here.
    clean_stale_temp_dirs(dest.parent)
    # In a multi-process launch every rank computes (training needs them all); only rank 0
    # installs the artifact.
    with (
        phase(f"build and install {plan.kind} {plan.id[:8]}"),
        ArtifactWriter(dest, plan, force=force, discard=not is_main_process()) as writer,
    ):
        build(writer)
    show_warnings(writer.warnings)
    return StepResult(artifact=writer.artifact, reused=False)


def show_warnings(warnings: list[str]) -> None:
    """A built artifact's warnings on stderr, once: when the step that caused them ran (a
    reused artifact's were shown when it was built; `uqc inspect` lists them again). Only
    the process that writes the artifact shows them; user text is printed as it is (no
    markup, no emoji codes)."""
    from rich.markup import escape

    if not is_main_process():
        return
    for message in warnings:
        stderr.print(
            f"[yellow]warning:[/yellow] {escape(message)}",
            soft_wrap=True,
            highlight=False,
            emoji=False,
        )


@dataclass(frozen=True)
class TrainingData:
    """What every training step reads: training and optional validation data, and their
    manifest entries (whose content fingerprints go into the artifact id)."""

    train: Any
    val: Any | None
    entries: list[dict[str, Any]]


def load_training_data(
    data: str,
    val: str | None,
    text_column: str,
    label_column: str,
    text_pair_column: str | None = None,
) -> TrainingData:
    """Load `--data` and `--val` (labels required) before any model work, so bad data fails
    first."""
    from uqcompress.data import load_data

    train = load_data(data, text_column, label_column, text_pair_column=text_pair_column)
    validation = (
        load_data(val, text_column, label_column, text_pair_column=text_pair_column)
        if val
        else None
    )
    entries = [train.manifest_entry("train")]
    if validation is not None:
        entries.append(validation.manifest_entry("val"))
    return TrainingData(train=train, val=validation, entries=entries)


RESUME_SUFFIX = ".resume"


def checkpoint_folder(dest: Path) -> Path:
    """The cache folder beside an output where its run keeps resumable checkpoints: never
    inside the artifact, removed when the run completes."""
    return dest.parent / sibling_temp_name(dest.name, RESUME_SUFFIX)


def checkpointing(cfg: Any, writer: ArtifactWriter) -> Any:
    """The `Checkpointing` of a training step's run (None without --checkpoint-every or
    --resume); --resume without a checkpoint there is refused."""
    from uqcompress.engine.train import CHECKPOINT_FILE, Checkpointing
    from uqcompress.errors import ConfigError

    if cfg.checkpoint_every is None and not cfg.resume:
        return None
    folder = checkpoint_folder(writer.dest)
    if cfg.resume and not any(folder.rglob(CHECKPOINT_FILE)):
        raise ConfigError(
            f"--resume: no checkpoint of this run in {folder}",
            hint="run without --resume (with --checkpoint-every N it writes checkpoints)",
        )
    return Checkpointing(folder, writer.plan.id)


def train_into(
    source: Any,
    train_cfg: Any,
    train_data: Any,
    val_data: Any,
    directory: Path,
    *,
    max_length: int | None,
    transform: Callable[[Any, bool], Any] | None = None,
    description: str = "finetune",
    checkpoint: Any = None,
    replace_head: bool = False,
    labels_hint: str | None = None,
    dtype: str = "float32",
    save_dtype: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Load the model of `source` as `dtype`, fine-tune it (`train.fine_tune`, `transform`,
    `replace_head` and `labels_hint` included) and save it into `directory` with its
    training history, cast to `save_dtype` if given (finetune's half `--dtype`: trained in
    float32, saved in the half dtype); returns the summary and the warnings for its
    manifest."""
    from uqcompress.data.encoding import check_input_kind
    from uqcompress.engine.train import fine_tune
    from uqcompress.models.loading import calibration_dropped, cast_loaded, load_model, save_model
    from uqcompress.models.summary import model_summary

    warnings: list[str] = []
    loaded = load_model(source, dtype)
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
        checkpoint=checkpoint,
        replace_head=replace_head,
        labels_hint=labels_hint,
    )
    warnings += tuned.warnings
    if save_dtype is not None:
        cast_loaded(tuned.loaded, save_dtype)
    save_model(tuned.loaded, directory)
    model = Path(str(source.path)).resolve().name
    warnings += write_history(tuned.result, directory, model, description, train_data.spec)
    summary = {**tuned.notes, **model_summary(tuned.loaded)}
    summary.update(training_summary(tuned.result, train_cfg, len(train_data)))
    return summary, warnings


HISTORY_FILE = "history.jsonl"
HISTORY_PLOT = "history.png"


def write_history(result: Any, directory: Path, model: str, step: str, data: str) -> list[str]:
    """Write the run's per-epoch history (`history.jsonl`: one JSON object per epoch with
    epoch, steps, lr, train_loss and the val_ metrics) and its curves (`history.png`, titled
    with the `model` trained, the `step` and its training `data`) into `directory`; returns
    warnings (a plot that could not be drawn)."""
    import json

    if not result.history:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row, sort_keys=False) for row in result.history]
    (directory / HISTORY_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        from uqcompress.uq.plots import save_training_curves

        save_training_curves(
            result.history, directory / HISTORY_PLOT, model, step, data, result.best_epoch
        )
    except ImportError as exc:  # matplotlib missing: the history itself is written
        return [f"{HISTORY_PLOT} was not drawn ({exc}); {HISTORY_FILE} holds the numbers"]
    return []


def training_summary(result: Any, train_cfg: Any, examples: int) -> dict[str, Any]:
    """What every training step's summary says about its training: steps, curves, the
    validation metrics of the weights kept, and which epoch they come from and why."""
    summary: dict[str, Any] = {
        "trained": True,
        "epochs": train_cfg.epochs,
        "epochs_run": len(result.history),
        "steps": result.steps,
        "train_examples": examples,
        "train_seconds": round(result.seconds, 3),
        "data_wait_seconds": round(result.data_wait_seconds, 3),
        "loss_curve": [round(v, 6) for v in result.loss_curve],
    }
    if result.val_curve and "acc" in result.val_curve[0]:
        summary["val_acc_curve"] = [round(m["acc"], 6) for m in result.val_curve]
        for name, value in result.kept_val.items():
            summary[f"val_{name}"] = round(value, 6)
    if result.sharded:  # --fsdp: how many transformer blocks were sharded units
        summary["fsdp_blocks"] = result.sharded_blocks
    if result.best_epoch is not None:
        summary["select_best"] = train_cfg.select_best
        summary["best_epoch"] = result.best_epoch
        summary["best_why"] = (
            f"lowest val {train_cfg.select_best}"
            if train_cfg.select_best != "acc"
            else "highest val acc"
        ) + f" of {len(result.history)} epoch{'' if len(result.history) == 1 else 's'}"
    if train_cfg.patience is not None:
        summary["stopped_early"] = result.stopped_early
    if result.resumed_from_step is not None:
        summary["resumed_from_step"] = result.resumed_from_step
    return summary


def _head_is_untrained(source: Any, loaded: Any) -> bool:
    """The checkpoint had no classifier weights, now or when it was imported."""
    from uqcompress.models.loading import head_never_trained

    if loaded.new_head_keys:
        return True
    return bool(source.is_artifact and head_never_trained(source))
