"""`uqc finetune`: train a model artifact on labelled data with the shared training loop."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.steps import config as fields
from uqcompress.steps.common import (
    StepResult,
    build_or_reuse,
    checkpointing,
    load_training_data,
    train_into,
)


@dataclass(frozen=True)
class FinetuneConfig(fields.TrainingOptions):
    # runtime: the data's content fingerprints, which cover the columns used, are in the id
    data: str = fields.runtime(
        help="Training data: builtin:NAME\\[@split], FILE.csv, a "
        "folder or hf:NAME\\[/CONFIG]@SPLIT."
    )
    val: str | None = fields.runtime(None, help="Validation data, scored after every epoch.")
    epochs: int = fields.described(3, help="Passes over the data.")
    lr: float = fields.described(5e-4, help="Peak learning rate.")
    weight_decay: float = 0.01
    batch_size: int = 32
    seed: int = 0
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    precision: str = fields.described(
        "fp32", help="fp32, or bf16 mixed precision (for GPUs; through accelerate)."
    )
    device: str = fields.device()
    threads: int | None = fields.threads()

    def train_config(self) -> Any:
        from uqcompress.engine.train import TrainConfig

        return TrainConfig.of(self)

    def validate(self) -> None:
        problems = fields.problems(self)
        problems.check(self.train_config().validate)
        problems.raise_any()


def run(
    model_path: Path, cfg: FinetuneConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import resolve_model_source

    cfg.validate()  # bad values fail before any data is read
    cfg = fields.resolve_training(cfg)
    train_cfg = cfg.train_config()
    members = _is_members(model_path)
    source = None if members else resolve_model_source(model_path)
    if source is not None:
        _refuse_student(source)
    loaded_data = load_training_data(
        cfg.data, cfg.val, cfg.text_column, cfg.label_column, cfg.text_pair_column
    )
    train_data, val_data = loaded_data.train, loaded_data.val
    config = asdict(cfg)
    plan = OutputPlan(
        kind="model",
        step="finetune",
        config=config,
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref] if source is not None else [],
        data=loaded_data.entries,
        device=cfg.device,
    )

    if members:
        return _run_members(model_path, cfg, train_cfg, train_data, val_data, plan, out, force)

    def build(writer: ArtifactWriter) -> None:
        summary, warnings = train_into(
            source,
            train_cfg,
            train_data,
            val_data,
            writer.dir,
            max_length=cfg.max_length,
            checkpoint=checkpointing(cfg, writer),
        )
        writer.summary.update(summary)
        for warning in warnings:
            writer.warn(warning)

    return build_or_reuse(plan, out, force, build)


def _refuse_student(source: Any) -> None:
    """A DIRECTOR student trains by distillation from its teacher, not on labels alone."""
    from uqcompress.errors import ConfigError
    from uqcompress.models.director_model import DIRECTOR
    from uqcompress.models.loading import source_kind

    if source_kind(source) is DIRECTOR:
        raise ConfigError(
            f"{source.path} is a DIRECTOR student; finetune would train it without its teacher",
            hint="distil again with uqc distill-director TEACHER --epochs N",
        )


def _is_members(path: Path) -> bool:
    from uqcompress.artifacts import MANIFEST_NAME, read_manifest

    return (path / MANIFEST_NAME).is_file() and read_manifest(path).kind == "members"


def _run_members(
    path: Path,
    cfg: FinetuneConfig,
    train_cfg: Any,
    train_data: Any,
    val_data: Any,
    plan: OutputPlan,
    out: Path | None,
    force: bool,
) -> StepResult:
    """Fine-tune every member of a members artifact: member m with seed + m (its own
    initial head noise, dropout and data order), into a new members artifact."""
    from dataclasses import replace

    from uqcompress.artifacts import SourceRef, open_artifact
    from uqcompress.models.loading import resolve_model_source

    artifact = open_artifact(path, expect_kind="members")
    count = int(artifact.manifest.summary["members"])
    plan = replace(plan, kind="members", inputs=[SourceRef.of("members", artifact)])

    def build(writer: ArtifactWriter) -> None:
        curves = []
        every = checkpointing(cfg, writer)
        for m in range(count):
            # each member keeps its checkpoint in its own subfolder; on --resume, the member
            # that has one continues from it, the others train from the start (same result)
            member_checkpoint = (
                None if every is None else replace(every, directory=every.directory / f"member{m}")
            )
            resume = member_checkpoint is not None and member_checkpoint.file.is_file()
            summary, warnings = train_into(
                resolve_model_source(path / f"member{m}"),
                replace(train_cfg, seed=cfg.seed + m, resume=cfg.resume and resume),
                train_data,
                val_data,
                writer.dir / f"member{m}",
                max_length=cfg.max_length,
                description=f"finetune member {m}",
                checkpoint=member_checkpoint,
            )
            curves.append(summary)
            for warning in dict.fromkeys(warnings):
                writer.warn(f"member {m}: {warning}")
        first = curves[0]
        writer.summary.update(
            {
                **{
                    k: v
                    for k, v in artifact.manifest.summary.items()
                    if k
                    in (
                        "members",
                        "select",
                        "method",
                        "heads_per_member",
                        "kept_heads",
                        "jaccard_per_layer",
                        "jaccard_mean",
                        "family",
                    )
                },
                "labels": first["labels"],
                "trained": True,
                "epochs": cfg.epochs,
                "train_seconds": round(sum(c["train_seconds"] for c in curves), 3),
                "loss_curves": [c["loss_curve"] for c in curves],
                "parameters_per_member": [c["parameters"] for c in curves],
            }
        )
        if all("val_acc" in c for c in curves):
            writer.summary["val_acc_per_member"] = [c["val_acc"] for c in curves]
        if all("best_epoch" in c for c in curves):
            writer.summary["select_best"] = first["select_best"]
            writer.summary["best_epoch_per_member"] = [c["best_epoch"] for c in curves]
        if every is not None:
            import shutil

            shutil.rmtree(every.directory, ignore_errors=True)

    return build_or_reuse(plan, out, force, build)
