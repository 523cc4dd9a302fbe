"""The one training loop (on `accelerate`), shared by finetune and every later training step.

AdamW, linear warm-up then linear decay, gradient clipping, rich progress on stderr.
Weight decay applies to weight matrices only: never to biases, norm weights or a module's
declared no-decay parameters (SVE's singular values), see `parameter_groups`.
Determinism: the same seed on CPU gives bitwise-identical weights (seeded global RNGs for
dropout, a seeded generator for shuffling, no data-dependent parallelism).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from uqcompress.errors import ConfigError
from uqcompress.runtime import interrupts

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader


PRECISIONS = {"fp32": "no", "bf16": "bf16"}


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    lr: float = 5e-4
    batch_size: int = 32
    seed: int = 0
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    device: str = "cpu"
    precision: str = "fp32"  # or "bf16": mixed precision through accelerate

    @classmethod
    def of(cls, step_config: Any) -> TrainConfig:
        """The training options of a training step's config: its fields of the same names
        (a step without `precision` trains in fp32)."""
        names = ("epochs", "lr", "weight_decay", "batch_size", "seed", "device", "precision")
        return cls(**{n: getattr(step_config, n) for n in names if hasattr(step_config, n)})

    def validate(self) -> None:
        """Every problem at once (errors.ConfigProblems; one problem reads as itself)."""
        from uqcompress.errors import Problems
        from uqcompress.runtime.distributed import world_size

        problems = Problems()
        if self.epochs < 1:
            problems.add(f"--epochs {self.epochs} must be at least 1", hint="pass --epochs 3")
        if not (0 < self.lr < 1):
            problems.add(f"--lr {self.lr} must be in (0, 1)", hint="pass e.g. --lr 5e-4")
        if self.batch_size < 1:
            problems.add(
                f"--batch-size {self.batch_size} must be at least 1", hint="pass --batch-size 32"
            )
        elif self.batch_size % world_size():
            problems.add(
                f"--batch-size {self.batch_size} does not split over {world_size()} processes",
                hint=f"pass a multiple of {world_size()} (the batch size is the global batch)",
            )
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            problems.add(
                f"--weight-decay {self.weight_decay} must be a finite number, 0 or more",
                hint="pass e.g. --weight-decay 0.01 (0 turns weight decay off)",
            )
        if self.precision not in PRECISIONS:
            problems.add(
                f"unknown --precision {self.precision!r}",
                hint=f"use one of: {', '.join(PRECISIONS)}",
            )
        problems.raise_any()


@dataclass
class TrainResult:
    loss_curve: list[float] = field(default_factory=list)  # mean training loss per epoch
    val_curve: list[dict[str, float]] = field(default_factory=list)  # per-epoch validation
    steps: int = 0
    seconds: float = 0.0


LossFn = Callable[["nn.Module", dict[str, Any]], "torch.Tensor"]
ValidateFn = Callable[["nn.Module"], dict[str, float]]


def classification_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Mean cross-entropy on one batch; for a model with M members (Hydra), the mean of the
    members' cross-entropies, every member seeing every example."""
    import torch.nn.functional as F

    from uqcompress.models.outputs import member_logits

    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = member_logits(model, inputs)  # [B, M, C]
    members = logits.shape[1]
    return F.cross_entropy(logits.flatten(0, 1), labels.repeat_interleave(members))


# A module lists the names of its own parameters that must never be decayed here, e.g.
# `NO_WEIGHT_DECAY = ("singular_values",)`: decay would pull them towards 0, i.e. shrink the
# pretrained function itself rather than regularise a weight matrix.
NO_DECAY_ATTRIBUTE = "NO_WEIGHT_DECAY"
_NORM_CLASS = re.compile(r"Norm(\d*d)?$")  # LayerNorm, RMSNorm, MemberLayerNorm, BatchNorm1d


def _is_norm(module: nn.Module) -> bool:
    """A normalisation layer, by type: torch's own and any class named `...Norm`."""
    from torch import nn

    return isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or any(
        _NORM_CLASS.search(cls.__name__) for cls in type(module).__mro__
    )


def no_decay_names(model: nn.Module) -> set[str]:
    """Names (as in `named_parameters()`) of the parameters that are never decayed: biases
    (named `bias`, or any parameter of fewer than 2 dimensions: gains, scales), every
    parameter of a norm layer, and those a module lists in its `NO_WEIGHT_DECAY`."""
    names: set[str] = set()
    for module_name, module in model.named_modules():
        declared = set(getattr(module, NO_DECAY_ATTRIBUTE, ()))
        norm = _is_norm(module)
        for name, param in module.named_parameters(recurse=False):
            if norm or name == "bias" or param.ndim < 2 or name in declared:
                names.add(f"{module_name}.{name}" if module_name else name)
    return names


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The trainable parameters as two AdamW groups: decayed (weight matrices, embeddings)
    and not decayed (see `no_decay_names`); an empty group is left out. A parameter shared
    by two modules appears once."""
    skip = no_decay_names(model)
    decay: list[nn.Parameter] = []
    keep: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (keep if name in skip else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def _linear_schedule(total: int, warmup: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def train(
    model: nn.Module,
    loader: DataLoader,
    cfg: TrainConfig,
    loss_fn: LossFn = classification_loss,
    validate: ValidateFn | None = None,
    description: str = "training",
) -> TrainResult:
    """Train ``model`` in place; returns loss and validation curves."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from uqcompress.runtime.console import stderr

    cfg.validate()
    set_seed(cfg.seed)
    from accelerate.utils import DataLoaderConfiguration

    # split_batches: --batch-size is the global batch, cut across processes, so a run on N
    # processes takes the same optimisation steps as a run on one.
    accelerator = Accelerator(
        cpu=cfg.device == "cpu",
        mixed_precision=PRECISIONS[cfg.precision],
        dataloader_config=DataLoaderConfiguration(split_batches=True),
    )
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr)
    steps_per_epoch = len(loader)
    total = cfg.epochs * steps_per_epoch
    warmup = max(1, math.ceil(cfg.warmup_ratio * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _linear_schedule(total, warmup))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    result = TrainResult()
    start = time.perf_counter()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[val]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        disable=not accelerator.is_main_process,
        transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total, loss=float("nan"), val="")
        for epoch in range(cfg.epochs):
            model.train()
            running, seen = 0.0, 0
            for batch in loader:
                interrupts.check()  # a Ctrl-C whose KeyboardInterrupt was lost stops here
                loss = loss_fn(model, batch)
                accelerator.backward(loss)
                if cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise ConfigError(
                        f"training diverged at epoch {epoch + 1} (loss {value})",
                        hint="lower --lr",
                    )
                running += value
                seen += 1
                result.steps += 1
                progress.update(task, advance=1, loss=running / seen)
            result.loss_curve.append(running / max(1, seen))
            if validate is not None:
                model.eval()
                metrics = validate(accelerator.unwrap_model(model))
                result.val_curve.append(metrics)
                shown = " ".join(f"val {k} {v:.4f}" for k, v in metrics.items())
                progress.update(task, val=shown)
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.eval()
    result.seconds = time.perf_counter() - start
    return result


@dataclass
class FineTuned:
    """A classifier (or what `transform` made of it) after `fine_tune`, on the CPU."""

    loaded: Any  # LoadedModel
    result: TrainResult
    # What changed before training (classifier_initialised, labels_from_data, truncated):
    # the first entries of the run's summary.
    notes: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def fine_tune(
    loaded: Any,
    train_data: Any,
    val_data: Any,
    cfg: TrainConfig,
    *,
    max_length: int | None,
    head_untrained: bool,
    source: str,
    transform: Callable[[Any], Any] | None = None,
    description: str = "finetune",
) -> FineTuned:
    """Fine-tune a loaded classifier on labelled data with `train`.

    A head that was never trained (`head_untrained`) is replaced by a fresh one sized by the
    data's classes; placeholder labels (LABEL_i) adopt the data's names. `transform` turns
    the label-checked model into the one to train (the SVE step builds its ensemble there).
    `source` names the model in warnings. Validation reports accuracy after every epoch.
    """
    from uqcompress.data.encoding import encode, make_loader
    from uqcompress.data.labels import map_labels
    from uqcompress.engine.inference import predict_logits
    from uqcompress.models.loading import has_default_labels
    from uqcompress.uq.metrics import accuracy, softmax

    notes: dict[str, Any] = {}
    warnings: list[str] = []
    if head_untrained:
        # An untrained head's size and label names came from the checkpoint's config, not
        # from any task: the training data decides both.
        from uqcompress.models.surgery import replace_classifier

        count = _class_count(train_data)
        replace_classifier(loaded, [f"LABEL_{i}" for i in range(count)], cfg.seed)
        notes["classifier_initialised"] = True
        warnings.append(
            f"{source} had no trained classifier; a new head for {count} classes "
            f"(from {train_data.spec}) was trained from scratch"
        )
    mapping = map_labels(train_data, loaded.labels, has_default_labels(loaded.labels))
    if mapping.adopted_labels is not None:
        _adopt_labels(loaded, mapping.adopted_labels)
        notes["labels_from_data"] = True
        warnings.append(
            f"the model had placeholder labels; adopted {len(loaded.labels)} label names "
            f"from {train_data.spec}: {', '.join(loaded.labels)}"
        )
    if transform is not None:
        loaded = transform(loaded)
    encoded = encode(train_data, loaded, mapping.ids, max_length)
    if encoded.truncated:
        notes["truncated"] = encoded.truncated
        warnings.append(f"{encoded.truncated} training texts were truncated to the max length")
    loader = make_loader(encoded, cfg.batch_size, shuffle=True, seed=cfg.seed)

    validate: Any = None
    if val_data is not None:
        val_ids = map_labels(val_data, loaded.labels, placeholder=False).ids
        val_encoded = encode(val_data, loaded, val_ids, max_length)

        def validate(model: Any) -> dict[str, float]:
            logits = predict_logits(model, val_encoded, device=cfg.device).member_logits
            return {"acc": accuracy(softmax(logits).mean(axis=1), val_ids)}

    result = train(
        loaded.model,
        loader,
        cfg,
        validate=validate,
        description=f"{description} {loaded.family.name}",
    )
    loaded.model.to("cpu")
    return FineTuned(loaded=loaded, result=result, notes=notes, warnings=warnings)


def _adopt_labels(loaded: Any, labels: list[str]) -> None:
    loaded.labels = list(labels)
    loaded.model.config.id2label = dict(enumerate(labels))
    loaded.model.config.label2id = {name: i for i, name in enumerate(labels)}


def _class_count(data: Any) -> int:
    """How many classes the training data names (its class names, else distinct labels)."""
    if data.label_names is not None:
        return len(data.label_names)
    return len({str(v) for v in data.labels or []})
