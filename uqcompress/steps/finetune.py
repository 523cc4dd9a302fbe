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
    with_planned_dtype,
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
        "fp32",
        help="fp32, or bf16 / fp16 mixed precision (through accelerate); a half --dtype sets it.",
    )
    device: str = fields.device()
    threads: int | None = fields.threads()
    # a half dtype: computed under autocast in it, float32 master weights, saved in it
    dtype: str = fields.dtype(
        also="A half dtype trains in mixed precision (float32 master weights, computed in the "
        "dtype) and saves the model in it."
    )

    def train_config(self) -> Any:
        from uqcompress.engine.train import TrainConfig

        return TrainConfig.of(self)

    def validate(self) -> None:
        problems = fields.problems(self)
        problems.check(self.train_config().validate)
        wanted = HALF_PRECISION.get(self.dtype)
        if wanted is not None and self.precision not in ("fp32", wanted):
            problems.add(
                f"--precision {self.precision} contradicts --dtype {self.dtype}, which trains "
                f"in {wanted} mixed precision",
                hint=f"drop --precision, or pass --precision {wanted}",
            )
        problems.raise_any()


# The mixed precision a half --dtype trains in. Pure half-precision training would hold the
# weights and AdamW's moments in 8 (bfloat16) or 11 (float16) mantissa bits, where an update
# below 2^-8 of a weight rounds away: the weights stay float32 while training and are cast
# to the dtype once, when the model is saved.
HALF_PRECISION = {"bfloat16": "bf16", "float16": "fp16"}


def with_training_dtype(cfg: FinetuneConfig, source: Any) -> FinetuneConfig:
    """`cfg` with `--dtype` resolved for `source` (`auto`: a >1B decoder's stored half
    dtype) and the mixed precision a half dtype trains in, so the recorded config and the
    id say how the run computed (`--dtype bfloat16` and `--dtype bfloat16 --precision bf16`
    are one run)."""
    from dataclasses import replace

    cfg = with_planned_dtype(cfg, source)
    wanted = HALF_PRECISION.get(cfg.dtype)
    if wanted is None or cfg.precision not in ("fp32", wanted):
        return cfg  # float32, or a --precision that contradicts the dtype: validate says so
    return replace(cfg, precision=wanted)


def run(
    model_path: Path, cfg: FinetuneConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import resolve_model_source

    cfg.validate()  # bad values fail before any data is read
    cfg = fields.resolve_training(cfg)
    members = _is_members(model_path)
    source = None if members else resolve_model_source(model_path)
    if source is not None:
        _refuse_student(source)
    # members share one base and its dtype: the first one's stands for all
    cfg = with_training_dtype(cfg, source or resolve_model_source(model_path / "member0"))
    cfg.validate()  # the resolved dtype against --precision
    train_cfg = cfg.train_config()
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
            save_dtype=cfg.dtype,
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
                save_dtype=cfg.dtype,
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
