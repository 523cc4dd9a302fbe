"""`uqc distill-director`: distil a classifier's blocks into one sampling DiT transition."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.steps import config as fields
from uqcompress.steps.common import (
    StepResult,
    build_or_reuse,
    checkpointing,
    load_training_data,
    training_summary,
    with_planned_dtype,
    write_history,
)

DEFAULT_LAMBDA_STD = 0.1  # the research code's std weight (`mlp_gamma`), --loss mse


@dataclass(frozen=True)
class DirectorConfig(fields.TrainingOptions):
    # runtime: the data's content fingerprints, which cover the columns used, are in the id
    data: str = fields.runtime(
        help="Training data: builtin:NAME\\[@split], FILE.csv, a "
        "folder or hf:NAME\\[/CONFIG]@SPLIT."
    )
    val: str | None = fields.runtime(None, help="Validation data (accuracy, ECE per epoch).")
    depth: int = fields.described(1, help="DiT blocks in the shared transition.")
    samples: int = fields.described(10, help="Roll-outs S averaged at inference (stored).")
    replace_last: int | None = fields.described(
        None, help="Replace only the last K blocks (the first L-K stay); default: all."
    )  # None: every layer
    loss: str = fields.described(
        "kl",
        help="Per-step distillation: kl (Gaussian KL; the NLL of the teacher's state when "
        "the teacher is deterministic), nll, or mse (the research code's).",
    )
    lambda_mean: float = fields.described(1.0, help="Weight of L1.")
    lambda_std: float | None = fields.described(
        None, help="Weight of the std term; only with --loss mse (default there: 0.1)."
    )  # --loss mse only (default DEFAULT_LAMBDA_STD there)
    lambda_ce: float = fields.described(1.0, help="Weight of the sampled roll-out's CE (L2).")
    # --freeze-head keeps the teacher's last MLP, norm and classifier
    train_head: bool = fields.option(
        True,
        name="freeze_head",
        parse=lambda freeze: not freeze,
        cli_default=False,
        help="Keep the teacher's last MLP, norm and classifier.",
    )
    epochs: int = fields.described(10, help="Passes over the data.")
    lr: float = fields.described(1e-3, help="Peak learning rate.")
    weight_decay: float = 0.01
    batch_size: int = 32
    seed: int = 0
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    text_pair_column: str | None = fields.runtime(None)
    device: str = fields.device()
    threads: int | None = fields.threads()
    # the frozen teacher's dtype; the transition (and a training head) stay float32
    dtype: str = fields.dtype()

    def train_config(self) -> Any:
        from uqcompress.engine.train import TrainConfig

        return TrainConfig.of(self)

    def validate(self) -> None:
        from uqcompress.methods.director import LOSSES

        problems = fields.problems(self)
        if self.loss not in LOSSES:
            problems.add(f"unknown --loss {self.loss!r}", hint=f"use one of: {', '.join(LOSSES)}")
        elif self.lambda_std is not None and self.loss != "mse":
            # The std term exists only in the mse loss: a weight given for another loss
            # would be silently ignored.
            problems.add(
                f"--lambda-std applies only to --loss mse; this run uses --loss {self.loss}",
                hint="drop --lambda-std, or pass --loss mse",
            )
        for name in ("lambda_mean", "lambda_std", "lambda_ce"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                flag = fields.flag(name)
                problems.add(
                    f"{flag} {getattr(self, name)} must be 0 or more", hint=f"pass {flag} 1"
                )
        problems.check(self.train_config().validate)
        problems.raise_any()


def run(
    model_path: Path, cfg: DirectorConfig, out: Path | None = None, force: bool = False
) -> StepResult:
    from uqcompress.models.loading import refuse_fused, resolve_model_source

    cfg.validate()
    cfg = fields.resolve_training(cfg)
    if cfg.loss == "mse" and cfg.lambda_std is None:  # resolved, so the manifest says it
        cfg = replace(cfg, lambda_std=DEFAULT_LAMBDA_STD)
    train_cfg = cfg.train_config()
    source = resolve_model_source(model_path)
    refuse_fused(source, "distill-director")
    cfg = with_planned_dtype(cfg, source)
    loaded_data = load_training_data(
        cfg.data, cfg.val, cfg.text_column, cfg.label_column, cfg.text_pair_column
    )
    train_data, val_data = loaded_data.train, loaded_data.val
    config = asdict(cfg)
    plan = OutputPlan(
        kind="model",
        step="distill-director",
        config=config,
        id_config=fields.id_config(cfg, config),
        inputs=[source.ref],
        data=loaded_data.entries,
        device=cfg.device,
    )

    def build(writer: ArtifactWriter) -> None:
        from uqcompress.models.loading import calibration_dropped, load_model

        teacher = load_model(source, cfg.dtype)
        if (dropped := calibration_dropped(teacher, source.path)) is not None:
            writer.warn(dropped)
        checkpoint = checkpointing(cfg, writer)
        writer.summary.update(
            _distill(teacher, cfg, train_cfg, train_data, val_data, writer, checkpoint, source.path)
        )

    return build_or_reuse(plan, out, force, build)


def _distill(
    teacher: Any,
    cfg: DirectorConfig,
    train_cfg: Any,
    train_data: Any,
    val_data: Any,
    writer: Any,
    checkpoint: Any,
    source_path: Any,
) -> dict[str, Any]:
    """Distil (methods/director_distill.py), save the student into the artifact, and
    summarise the run (the history plot names the teacher at `source_path`)."""
    from uqcompress.data.encoding import check_input_kind
    from uqcompress.methods.director import LossWeights
    from uqcompress.methods.director_distill import distill
    from uqcompress.models.loading import save_model
    from uqcompress.models.summary import model_summary

    for each in [train_data] + ([val_data] if val_data is not None else []):
        check_input_kind(each, teacher.input_kind, teacher.family.name)
    std_weight = cfg.lambda_std if cfg.lambda_std is not None else 0.0  # unused unless mse
    weights = LossWeights(cfg.loss, cfg.lambda_mean, std_weight, cfg.lambda_ce)
    done = distill(
        teacher,
        train_data,
        val_data,
        train_cfg,
        replace_last=cfg.replace_last,
        depth=cfg.depth,
        samples=cfg.samples,
        train_head=cfg.train_head,
        weights=weights,
        max_length=cfg.max_length,
        warn=writer.warn,
        checkpoint=checkpoint,
    )
    counts, result, per_step_curve = done.counts, done.train, done.per_step_curve
    loaded = teacher.derived(done.student, done.config)
    save_model(loaded, writer.dir)
    summary = model_summary(loaded)
    summary.update(
        {
            "parameters_teacher": counts["teacher"],
            "parameters_transition": counts["transition"],
            "parameters_ratio_to_teacher": round(counts["student"] / counts["teacher"], 4),
            "replace_last": done.student.spec.replace_last,
            "depth": cfg.depth,
            "samples": cfg.samples,
            "loss": cfg.loss,
            **training_summary(result, train_cfg, len(train_data)),
            "distill_loss_per_step": [round(v, 6) for v in per_step_curve[-1]]
            if per_step_curve
            else [],
            "distill_loss_curve": [round(sum(s) / len(s), 6) for s in per_step_curve],
        }
    )
    model = Path(str(source_path)).resolve().name
    for warning in write_history(result, writer.dir, model, "distill-director", train_data.spec):
        writer.warn(warning)
    return summary
