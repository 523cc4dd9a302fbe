"""DIRECTOR distillation (ALGORITHMS.md section 4.3): train a student's transition (and, by
flag, the teacher's head it keeps) on a frozen teacher's states, with the shared training loop.

The loss of a batch is L1 + lambda_ce L2: L1 the per-step distillation loss under teacher
forcing (`methods.director.distillation_loss`), L2 the cross-entropy of one sampled roll-out
(`methods.director.sampled_ce`). The student is `models/director_model.py`, the losses
`methods/director.py`; this module is the loop around them and what it records per epoch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from uqcompress.methods.director import (
    LossWeights,
    build_student,
    distillation_loss,
    no_dropout,
    parameter_counts,
    record_teacher_states,
    sampled_ce,
)
from uqcompress.models.director_model import DirectorModel
from uqcompress.models.kinds import DIRECTOR_KEY

if TYPE_CHECKING:
    from uqcompress.data import LabeledData
    from uqcompress.engine.train import TrainConfig, TrainResult
    from uqcompress.models.loading import LoadedModel


class Distiller(nn.Module):
    """The student for the training loop: its forward is the loss, so a DDP wrapper
    synchronises the student's gradients. The frozen teacher rides along unregistered (not
    trained, not saved, not wrapped).

    Shape: a batch of `[B, ...]` inputs and `labels` `[B]` -> a scalar loss.
    """

    def __init__(
        self,
        student: DirectorModel,
        teacher: nn.Module,
        family: str,
        weights: LossWeights,
        seed: int,
    ) -> None:
        super().__init__()
        self.student = student
        self.frozen = (teacher,)  # a tuple, so nn.Module does not register the teacher
        self.family, self.weights, self.seed = family, weights, seed
        self.batches = 0  # seeds each batch's sampled roll-out
        self.step_losses: list[torch.Tensor] = []  # per batch, L1 per step `[K]`

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        teacher = self.frozen[0]
        labels = batch["labels"]
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        teacher.to(labels.device)  # a no-op after the first batch
        with no_dropout(teacher):
            states = record_teacher_states(
                teacher, self.family, self.student.spec.replace_last, inputs
            )
        l1, per_step = distillation_loss(self.student, states, self.weights)
        self.step_losses.append(per_step.cpu())
        self.batches += 1
        seed = self.seed * 1_000_003 + self.batches
        return l1 + self.weights.ce * sampled_ce(self.student, inputs, labels, seed)

    def epoch_losses(self) -> list[float] | None:
        """The mean L1 per step over the batches since the last call (None: no batch)."""
        if not self.step_losses:
            return None
        means: list[float] = torch.stack(self.step_losses).mean(dim=0).tolist()
        self.step_losses.clear()
        return means


@dataclass
class Distilled:
    """A trained student and what its training recorded."""

    student: DirectorModel
    config: Any  # the teacher's config with the student's spec under DIRECTOR_KEY
    train: TrainResult
    per_step_curve: list[list[float]]  # per epoch, the mean L1 of each of the K steps
    val_metrics: list[dict[str, float]]  # per epoch: acc, ece (with validation data)
    counts: dict[str, int]  # parameters: teacher, student, transition


def distill(
    teacher: LoadedModel,
    train_data: LabeledData,
    val_data: LabeledData | None,
    train_cfg: TrainConfig,
    *,
    replace_last: int | None,
    depth: int,
    samples: int,
    train_head: bool,
    weights: LossWeights,
    max_length: int | None,
    warn: Callable[[str], None],
) -> Distilled:
    """Distil `teacher` (left frozen, on the CPU afterwards) into a new student; the student
    comes back on the CPU. `warn` receives what the run's record should say."""
    from uqcompress.data.encoding import encode, make_loader
    from uqcompress.data.labels import map_labels
    from uqcompress.engine.inference import predict_logits
    from uqcompress.engine.train import train
    from uqcompress.uq.metrics import accuracy, ece, softmax

    seed = train_cfg.seed
    student = build_student(teacher, replace_last, depth, samples, seed, train_head)
    config = copy.deepcopy(teacher.config)
    setattr(config, DIRECTOR_KEY, student.spec.to_dict())
    student.config = config
    ids = map_labels(train_data, teacher.labels, placeholder=False).ids
    encoded = encode(train_data, teacher, ids, max_length)
    loader = make_loader(encoded, train_cfg.batch_size, shuffle=True, seed=seed)
    family = teacher.family.name
    frozen_teacher: nn.Module = teacher.model
    for param in frozen_teacher.parameters():
        param.requires_grad_(False)
    if weights.loss == "kl":
        warn(
            f"the {family} teacher's layers are deterministic (no variance to match): --loss kl "
            "is the Gaussian NLL of the teacher's states under the student"
        )
    distiller = Distiller(student, frozen_teacher, family, weights, seed)

    def loss_fn(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = model(batch)
        return loss

    per_step_curve: list[list[float]] = []
    val_metrics: list[dict[str, float]] = []
    validate: Any = None
    if val_data is not None:
        val_ids = map_labels(val_data, teacher.labels, placeholder=False).ids
        val_encoded = encode(val_data, teacher, val_ids, max_length)

        def validate(_model: Any) -> dict[str, float]:
            logits = predict_logits(student, val_encoded, device=train_cfg.device).member_logits
            probs = softmax(logits).mean(axis=1)
            metrics = {"acc": accuracy(probs, val_ids), "ece": ece(probs, val_ids)}
            val_metrics.append(metrics)
            return metrics

    def end_of_epoch_validate(model: Any) -> dict[str, float]:
        if (losses := distiller.epoch_losses()) is not None:
            per_step_curve.append(losses)
        return validate(model) if validate is not None else {}

    result = train(
        distiller,
        loader,
        train_cfg,
        loss_fn=loss_fn,
        validate=end_of_epoch_validate,
        description=f"distill-director {family}",
    )
    student.to("cpu")
    frozen_teacher.to("cpu")
    counts = parameter_counts(frozen_teacher, student)
    if counts["student"] >= counts["teacher"]:
        warn(
            f"the student has {counts['student']:,} parameters, the teacher "
            f"{counts['teacher']:,}: for a model this small one DiT block is not smaller "
            "(it pays off for deeper teachers)"
        )
    return Distilled(student, config, result, per_step_curve, val_metrics, counts)
