"""`uqc distill-director`: distil a classifier's blocks into one sampling DiT transition."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from uqcompress.artifacts import ArtifactWriter, OutputPlan
from uqcompress.steps import config as fields
from uqcompress.steps.common import StepResult, build_or_reuse, load_training_data

DEFAULT_LAMBDA_STD = 0.1  # the research code's std weight (`mlp_gamma`), --loss mse


@dataclass(frozen=True)
class DirectorConfig:
    # runtime: the data's content fingerprints, which cover the columns used, are in the id
    data: str = fields.runtime()
    val: str | None = fields.runtime(None)
    depth: int = 1
    samples: int = 10
    replace_last: int | None = None  # None: every layer
    loss: str = "kl"
    lambda_mean: float = 1.0
    lambda_std: float | None = None  # --loss mse only (default DEFAULT_LAMBDA_STD there)
    lambda_ce: float = 1.0
    # --freeze-head keeps the teacher's last MLP, norm and classifier
    train_head: bool = fields.option(True, name="freeze_head", parse=lambda freeze: not freeze)
    epochs: int = 10
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch_size: int = 32
    seed: int = 0
    max_length: int | None = None
    text_column: str = fields.runtime("text")
    label_column: str = fields.runtime("label")
    device: str = fields.device()
    threads: int | None = fields.threads()

    def train_config(self) -> Any:
        from uqcompress.train import TrainConfig

        return TrainConfig(
            epochs=self.epochs,
            lr=self.lr,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            seed=self.seed,
            device=self.device,
        )

    def validate(self) -> None:
        from uqcompress.methods.director import LOSSES

        problems = fields.problems(self)
        if self.samples < 1:
            problems.add(f"--samples {self.samples} must be at least 1", hint="pass --samples 10")
        if self.depth < 1:
            problems.add(f"--depth {self.depth} must be at least 1", hint="pass --depth 1")
        if self.replace_last is not None and self.replace_last < 1:
            problems.add(
                f"--replace-last {self.replace_last} must be at least 1",
                hint="drop --replace-last to replace every layer",
            )
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
    if cfg.loss == "mse" and cfg.lambda_std is None:  # resolved, so the manifest says it
        cfg = replace(cfg, lambda_std=DEFAULT_LAMBDA_STD)
    train_cfg = cfg.train_config()
    source = resolve_model_source(model_path)
    refuse_fused(source, "distill-director")
    loaded_data = load_training_data(cfg.data, cfg.val, cfg.text_column, cfg.label_column)
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

        teacher = load_model(source)
        if (dropped := calibration_dropped(teacher, source.path)) is not None:
            writer.warn(dropped)
        writer.summary.update(_distill(teacher, cfg, train_cfg, train_data, val_data, writer))

    return build_or_reuse(plan, out, force, build)


def _distill(
    teacher: Any, cfg: DirectorConfig, train_cfg: Any, train_data: Any, val_data: Any, writer: Any
) -> dict[str, Any]:
    import copy

    import torch
    from torch import nn

    from uqcompress.data.encoding import check_input_kind, encode, make_loader
    from uqcompress.data.labels import map_labels
    from uqcompress.inference import predict_logits
    from uqcompress.methods.director import (
        DIRECTOR_KEY,
        LossWeights,
        build_student,
        distillation_loss,
        no_dropout,
        parameter_counts,
        record_teacher_states,
        sampled_ce,
        student_trainable,
    )
    from uqcompress.models.loading import save_model
    from uqcompress.steps.init import model_summary
    from uqcompress.train import train
    from uqcompress.uq.metrics import accuracy, ece, softmax

    for each in [train_data] + ([val_data] if val_data is not None else []):
        check_input_kind(each, teacher.input_kind, teacher.family.name)
    student = build_student(
        teacher, cfg.replace_last, cfg.depth, cfg.samples, cfg.seed, cfg.train_head
    )
    student_trainable(student, cfg.train_head)
    config = copy.deepcopy(teacher.config)
    setattr(config, DIRECTOR_KEY, student.spec.to_dict())
    student.config = config
    ids = map_labels(train_data, teacher.labels, placeholder=False).ids
    encoded = encode(train_data, teacher, ids, cfg.max_length)
    loader = make_loader(encoded, cfg.batch_size, shuffle=True, seed=cfg.seed)
    std_weight = cfg.lambda_std if cfg.lambda_std is not None else 0.0  # unused unless mse
    weights = LossWeights(cfg.loss, cfg.lambda_mean, std_weight, cfg.lambda_ce)
    family = teacher.family.name
    frozen_teacher = teacher.model
    for param in frozen_teacher.parameters():
        param.requires_grad_(False)
    if cfg.loss == "kl":
        writer.warn(
            f"the {family} teacher's layers are deterministic (no variance to match): --loss kl "
            "is the Gaussian NLL of the teacher's states under the student"
        )

    steps_seen = {"batches": 0}
    epoch_steps: list[torch.Tensor] = []

    class Distiller(nn.Module):
        """The student for the training loop (its forward is the loss, so a DDP wrapper
        synchronises gradients); the frozen teacher rides along unregistered."""

        def __init__(self) -> None:
            super().__init__()
            self.student = student

        def forward(self, batch: dict[str, Any]) -> torch.Tensor:
            labels = batch["labels"]
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            frozen_teacher.to(labels.device)  # a no-op after the first batch
            with no_dropout(frozen_teacher):
                states = record_teacher_states(
                    frozen_teacher, family, student.spec.replace_last, inputs
                )
            l1, per_step = distillation_loss(student, states, weights)
            epoch_steps.append(per_step.cpu())
            steps_seen["batches"] += 1
            seed = cfg.seed * 1_000_003 + steps_seen["batches"]
            return l1 + weights.ce * sampled_ce(student, inputs, labels, seed)

    def loss_fn(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = model(batch)
        return loss

    per_step_curve: list[list[float]] = []
    val_metrics: list[dict[str, float]] = []
    validate: Any = None
    if val_data is not None:
        val_ids = map_labels(val_data, teacher.labels, placeholder=False).ids
        val_encoded = encode(val_data, teacher, val_ids, cfg.max_length)

        def validate(_model: Any) -> dict[str, float]:
            logits = predict_logits(student, val_encoded, device=cfg.device).member_logits
            probs = softmax(logits).mean(axis=1)
            metrics = {"acc": accuracy(probs, val_ids), "ece": ece(probs, val_ids)}
            val_metrics.append(metrics)
            return metrics

    def end_of_epoch_validate(model: Any) -> dict[str, float]:
        if epoch_steps:
            per_step_curve.append(torch.stack(epoch_steps).mean(dim=0).tolist())
            epoch_steps.clear()
        return validate(model) if validate is not None else {}

    result = train(
        Distiller(),
        loader,
        train_cfg,
        loss_fn=loss_fn,
        validate=end_of_epoch_validate,
        description=f"distill-director {family}",
    )
    student.to("cpu")
    frozen_teacher.to("cpu")
    loaded = teacher.derived(student, config)
    save_model(loaded, writer.dir)
    counts = parameter_counts(frozen_teacher, student)
    summary = model_summary(loaded)
    summary.update(
        {
            "parameters_teacher": counts["teacher"],
            "parameters_transition": counts["transition"],
            "parameters_ratio_to_teacher": round(counts["student"] / counts["teacher"], 4),
            "replace_last": student.spec.replace_last,
            "depth": cfg.depth,
            "samples": cfg.samples,
            "loss": cfg.loss,
            "trained": True,
            "epochs": cfg.epochs,
            "steps": result.steps,
            "train_examples": len(train_data),
            "train_seconds": round(result.seconds, 3),
            "loss_curve": [round(v, 6) for v in result.loss_curve],
            "distill_loss_per_step": [round(v, 6) for v in per_step_curve[-1]]
            if per_step_curve
            else [],
            "distill_loss_curve": [round(sum(s) / len(s), 6) for s in per_step_curve],
        }
    )
    if val_metrics:
        summary["val_acc_curve"] = [round(m["acc"], 6) for m in val_metrics]
        summary["val_acc"] = round(val_metrics[-1]["acc"], 6)
        summary["val_ece"] = round(val_metrics[-1]["ece"], 6)
    if counts["student"] >= counts["teacher"]:
        writer.warn(
            f"the student has {counts['student']:,} parameters, the teacher "
            f"{counts['teacher']:,}: for a model this small one DiT block is not smaller "
            "(it pays off for deeper teachers)"
        )
    return summary
