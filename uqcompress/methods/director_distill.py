"""DIRECTOR distillation (docs/methods/director.md): train a student's transition (and, by
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
    BatchSplit,
    LossWeights,
    build_student,
    distillation_loss,
    no_dropout,
    parameter_counts,
    record_teacher_states,
    sampled_ce,
)
from uqcompress.models.director_model import DirectorModel
from uqcompress.models.kind_base import DIRECTOR_KEY

if TYPE_CHECKING:
    from uqcompress.data import LabeledData
    from uqcompress.engine.train import Checkpointing, TrainConfig, TrainResult
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
        pad_left: bool = False,
    ) -> None:
        super().__init__()
        self.student = student
        self.frozen = (teacher,)  # a tuple, so nn.Module does not register the teacher
        self.family, self.weights, self.seed = family, weights, seed
        # training batches are cut across processes (the loop's split_batches); validation
        # runs whole batches on every process
        self.split = BatchSplit(pad_left=pad_left)
        self.batches = 0  # seeds each batch's sampled roll-out
        self.val_batches = 0  # seeds the validation roll-outs (eval mode)
        self.step_losses: list[torch.Tensor] = []  # per batch, L1 per step `[K]`

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """The loss of one batch. In eval mode (validation) nothing is recorded and each
        batch's roll-out is seeded by its position in the validation pass (`val_batches`)."""
        teacher = self.frozen[0]
        labels = batch["labels"]
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        teacher.to(labels.device)  # a no-op after the first batch
        with no_dropout(teacher):
            states = record_teacher_states(
                teacher, self.family, self.student.spec.replace_last, inputs
            )
        l1, per_step = distillation_loss(self.student, states, self.weights)
        if not self.training:
            self.val_batches += 1
            seed = self.seed * 1_000_003 - self.val_batches
            return l1 + self.weights.ce * sampled_ce(self.student, inputs, labels, seed)
        self.step_losses.append(per_step.detach().cpu())
        self.batches += 1
        seed = self.seed * 1_000_003 + self.batches
        return l1 + self.weights.ce * sampled_ce(self.student, inputs, labels, seed, self.split)

    def get_extra_state(self) -> dict[str, Any]:
        """The batch counter (it seeds the roll-outs) and this epoch's per-step losses: a
        resumed run goes on where the checkpoint left off."""
        losses = torch.stack(self.step_losses) if self.step_losses else torch.zeros(0)
        return {"batches": self.batches, "step_losses": losses}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.batches = int(state["batches"])
        self.step_losses = list(state["step_losses"].unbind(0))

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
    checkpoint: Checkpointing | None = None,
) -> Distilled:
    """Distil `teacher` (left frozen, on the CPU afterwards) into a new student; the student
    comes back on the CPU. `warn` receives what the run's record should say."""
    from uqcompress.data.encoding import (
        encode,
        make_loader,
        record_max_length,
        record_text_input,
    )
    from uqcompress.data.labels import map_labels
    from uqcompress.engine.inference import predict_logits
    from uqcompress.engine.train import train, validation_metrics

    seed = train_cfg.seed
    student = build_student(teacher, replace_last, depth, samples, seed, train_head)
    config = copy.deepcopy(teacher.config)
    setattr(config, DIRECTOR_KEY, student.spec.to_dict())
    student.config = config
    ids = map_labels(train_data, teacher.labels, placeholder=False).ids
    encoded = encode(
        train_data,
        teacher,
        ids,
        max_length,
        augment=train_cfg.augment,
        workers=train_cfg.workers,
    )
    record_text_input(config, train_data)  # the teacher's, checked above: no change
    record_max_length(config, teacher, max_length)
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
    distiller = Distiller(student, frozen_teacher, family, weights, seed, encoded.pad_left)

    def loss_fn(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        loss: torch.Tensor = model(batch)
        return loss

    validate: Any = None
    if val_data is not None:
        val_ids = map_labels(val_data, teacher.labels, placeholder=False).ids
        val_encoded = encode(val_data, teacher, val_ids, max_length, workers=train_cfg.workers)
        val_loader = make_loader(val_encoded, train_cfg.batch_size)

        def validate(_model: Any) -> dict[str, float]:
            logits = predict_logits(student, val_encoded, device=train_cfg.device).member_logits
            metrics = validation_metrics(logits, val_ids)
            # the distillation loss on the validation data, seeded the same way every epoch
            distiller.val_batches, total, count = 0, 0.0, 0
            with torch.no_grad():
                for batch in val_loader:
                    moved = {k: v.to(train_cfg.device) for k, v in batch.items()}
                    size = int(moved["labels"].shape[0])
                    total += float(distiller(moved)) * size
                    count += size
            metrics["loss"] = total / max(1, count)
            return metrics

    def epoch_end(_model: Any) -> dict[str, Any]:
        losses = distiller.epoch_losses()
        return {"distill_loss_per_step": losses} if losses is not None else {}

    result = train(
        distiller,
        loader,
        train_cfg,
        loss_fn=loss_fn,
        validate=validate,
        description=f"distill-director {family}",
        epoch_end=epoch_end,
        checkpoint=checkpoint,
    )
    if result.sharded:  # --fsdp: the student's full weights, gathered from every process
        from uqcompress.engine import sharding

        rebuilt: Any = sharding.unsharded(teacher.derived(student, config), distiller, "student.")
        student = rebuilt
    per_step_curve = [
        row["distill_loss_per_step"] for row in result.history if "distill_loss_per_step" in row
    ]
    val_metrics = result.val_curve
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
