"""The one training loop (on `accelerate`), shared by finetune and every later training step.

AdamW (or Adam, SGD: `--optimizer`), linear warm-up then linear decay, gradient clipping, an
optional exponential moving average of the trained weights (`--ema`), rich progress on stderr.
Weight decay applies to weight matrices only: never to biases, norm weights or a module's
declared no-decay parameters (SVE's singular values), see `parameter_groups`.
Determinism: the same seed on CPU gives bitwise-identical weights (seeded global RNGs for
dropout, a seeded generator for shuffling, no data-dependent parallelism).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from uqcompress.engine import sharding
from uqcompress.errors import ConfigError, DataError
from uqcompress.runtime import interrupts

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader


PRECISIONS = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
SCHEDULES = ("linear", "cosine", "constant")
# --select-best metrics on --val, and whether higher is better
SELECT_METRICS = {"nll": False, "acc": True, "ece": False, "loss": False}
NO_SELECTION = "none"
# --optimizer: AdamW decays weights decoupled from the gradient (w -= lr * wd * w); Adam and
# SGD add wd * w to the gradient (L2), as torch.optim.Adam / SGD do, so with Adam the decay
# is rescaled by the adaptive step like any gradient. SGD uses momentum 0.9.
OPTIMIZERS = ("adamw", "adam", "sgd")
SGD_MOMENTUM = 0.9


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    lr: float = 5e-4
    batch_size: int = 32  # examples per forward pass (one micro-batch with grad_accum > 1)
    seed: int = 0
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1  # --warmup: a fraction of the optimizer steps
    max_grad_norm: float = 1.0
    device: str = "cpu"
    precision: str = "fp32"  # or "bf16"/"fp16": mixed precision through accelerate
    select_best: str = NO_SELECTION  # a SELECT_METRICS key: keep the best epoch's weights
    patience: int | None = None  # stop after this many epochs without a better select_best
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int | None = None  # optimizer steps; overrides epochs
    schedule: str = "linear"
    checkpoint_every: int | None = None  # optimizer steps between resumable checkpoints
    resume: bool = False
    optimizer: str = "adamw"
    ema: float | None = None  # decay of the exponential moving average of the weights
    ema_every: int = 1  # optimizer steps between EMA updates
    ema_start: int = 0  # optimizer steps before which the average just follows the weights
    has_val: bool = False  # validation data was given (select_best needs it)
    augment: str = "none"  # --augment: none or light (image training data only)
    workers: int = 0  # --workers: data-loader worker processes
    fsdp: bool = False  # --fsdp: shard weights, gradients and optimizer state (engine/sharding)

    @classmethod
    def of(cls, step_config: Any) -> TrainConfig:
        """The training options of a training step's config: its fields of the same names
        (a step without `precision` trains in fp32). `select_best` None resolves to nll
        with validation data and none without; `warmup` is `warmup_ratio`."""
        names = (
            "epochs",
            "lr",
            "weight_decay",
            "batch_size",
            "seed",
            "device",
            "precision",
            "patience",
            "grad_accum",
            "max_steps",
            "schedule",
            "checkpoint_every",
            "resume",
            "augment",
            "workers",
            "fsdp",
            "optimizer",
            "ema",
            "ema_every",
            "ema_start",
        )
        values = {n: getattr(step_config, n) for n in names if hasattr(step_config, n)}
        has_val = getattr(step_config, "val", None) is not None
        values["has_val"] = has_val
        if hasattr(step_config, "warmup"):
            values["warmup_ratio"] = step_config.warmup
        values["select_best"] = resolve_select_best(
            getattr(step_config, "select_best", None), has_val
        )
        return cls(**values)

    def validate(self) -> None:
        """Every problem at once (errors.ConfigProblems; one problem reads as itself)."""
        from uqcompress.errors import Problems
        from uqcompress.runtime.distributed import world_size

        problems = Problems()
        self._validate_counts(problems)
        if not (0 < self.lr < 1):
            problems.add(f"--lr {self.lr} must be in (0, 1)", hint="pass e.g. --lr 5e-4")
        if self.batch_size >= 1 and self.batch_size % world_size():
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
        self._validate_options(problems)
        problems.raise_any()

    def _validate_counts(self, problems: Any) -> None:
        """Every count option within its bounds (runtime/limits: declared once, the same as
        the step configs check)."""
        from uqcompress.runtime.limits import bound_problems

        for option in dataclasses.fields(self):
            flag = "--" + option.name.replace("_", "-")
            found = bound_problems(option.name, getattr(self, option.name), flag, option.default)
            if found is not None:
                problems.add(found[0], hint=found[1])

    def _validate_options(self, problems: Any) -> None:
        """The problems of the selection, accumulation, schedule and checkpoint options."""
        metrics = ", ".join([*SELECT_METRICS, NO_SELECTION])
        if self.select_best not in (*SELECT_METRICS, NO_SELECTION):
            problems.add(
                f"unknown --select-best {self.select_best!r}", hint=f"use one of: {metrics}"
            )
        elif self.select_best != NO_SELECTION and not self.has_val:
            problems.add(
                f"--select-best {self.select_best} needs validation data to score the epochs",
                hint="pass --val DATA, or drop --select-best",
            )
        if self.patience is not None and self.patience >= 1 and self.select_best == NO_SELECTION:
            problems.add(
                "--patience stops on a validation metric, but this run has none "
                + ("(--select-best none)" if self.has_val else "(no --val)"),
                hint="pass --val DATA (it selects nll by default) or --select-best METRIC",
            )
        from uqcompress.data.images import AUGMENTS

        if self.augment not in AUGMENTS:
            problems.add(
                f"unknown --augment {self.augment!r}", hint=f"use one of: {', '.join(AUGMENTS)}"
            )
        if self.schedule not in SCHEDULES:
            problems.add(
                f"unknown --schedule {self.schedule!r}", hint=f"use one of: {', '.join(SCHEDULES)}"
            )
        if not (0 <= self.warmup_ratio < 1):
            problems.add(
                f"--warmup {self.warmup_ratio} must be a fraction of the steps in [0, 1)",
                hint="pass e.g. --warmup 0.1 (10% of the optimizer steps; 0: none)",
            )
        self._validate_optimizer(problems)

    def _validate_optimizer(self, problems: Any) -> None:
        """The problems of --optimizer and the EMA options."""
        if self.optimizer not in OPTIMIZERS:
            problems.add(
                f"unknown --optimizer {self.optimizer!r}",
                hint=f"use one of: {', '.join(OPTIMIZERS)}",
            )
        if self.ema is not None and not (0 < self.ema < 1):
            problems.add(
                f"--ema {self.ema} must be a decay in (0, 1)",
                hint="pass e.g. --ema 0.995 (the average keeps 99.5% of itself per update)",
            )
        if self.ema is None and (self.ema_every != 1 or self.ema_start != 0):
            problems.add(
                "--ema-every and --ema-start shape an average that --ema turns on, and this "
                "run has no --ema",
                hint="pass --ema DECAY, or drop --ema-every / --ema-start",
            )


def resolve_select_best(value: str | None, has_val: bool) -> str:
    """`--select-best` as the run uses it: None means nll with validation data, else none."""
    if value is None:
        return "nll" if has_val else NO_SELECTION
    return value


@dataclass
class TrainResult:
    loss_curve: list[float] = field(default_factory=list)  # mean training loss per epoch
    val_curve: list[dict[str, float]] = field(default_factory=list)  # per-epoch validation
    # per epoch: epoch, steps, lr, train_loss, val_<metric>..., and what `epoch_end` added
    history: list[dict[str, Any]] = field(default_factory=list)
    sharded: bool = False  # trained with FSDP (engine/sharding): the model is still sharded
    sharded_blocks: int = 0
    steps: int = 0  # optimizer steps
    seconds: float = 0.0
    # of `seconds`, the time the loop waited for the data loader's next batch
    data_wait_seconds: float = 0.0
    best_epoch: int | None = None  # 1-based; the weights kept (with select_best)
    stopped_early: bool = False  # --patience ended the run
    resumed_from_step: int | None = None

    @property
    def kept_val(self) -> dict[str, float]:
        """The validation metrics of the weights kept: the best epoch's, else the last's."""
        if not self.val_curve:
            return {}
        if self.best_epoch is not None:
            return self.val_curve[self.best_epoch - 1]
        return self.val_curve[-1]


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


def schedule_factor(name: str, total: int, warmup: int) -> Callable[[int], float]:
    """The learning-rate factor of optimizer step `step` (0-based): a linear warm-up over
    `warmup` steps, then linear decay to 0 at `total`, a cosine half-wave to 0, or constant."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if name == "constant":
            return 1.0
        if name == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The `--optimizer` over the model's trainable parameters, weight decay by
    `parameter_groups` (AdamW: decoupled; Adam, SGD: L2 added to the gradient)."""
    import torch

    groups = parameter_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=cfg.lr)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=SGD_MOMENTUM)
    return torch.optim.AdamW(groups, lr=cfg.lr)


class WeightAverage:
    """An exponential moving average of a model's trainable parameters (`--ema DECAY`).

    After optimizer step s (1-based): up to `start` the average is a copy of the weights;
    after that, every `every` steps, avg = decay * avg + (1 - decay) * w. `applied` puts the
    average into the model's parameters in place (validation, best-epoch selection and the
    saved artifact use it) and restores the trained weights afterwards. Its state is part of
    the resumable checkpoint.
    """

    def __init__(self, model: nn.Module, decay: float, every: int = 1, start: int = 0) -> None:
        self.decay, self.every, self.start = decay, every, start
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    def update(self, step: int) -> None:
        """Fold in the weights after optimizer step `step` (1-based)."""
        import torch

        with torch.no_grad():
            if step <= self.start:
                for name, param in self.params.items():
                    self.shadow[name].copy_(param)
            elif (step - self.start) % self.every == 0:
                for name, param in self.params.items():
                    self.shadow[name].lerp_(param.detach(), 1.0 - self.decay)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The average in the model's parameters for the duration; the weights after."""
        import torch

        with torch.no_grad():
            backup = {n: p.detach().clone() for n, p in self.params.items()}
            for name, param in self.params.items():
                param.copy_(self.shadow[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in self.params.items():
                    param.copy_(backup[name])

    def copy_to_model(self) -> None:
        """Leave the average in the model's parameters (the end of training)."""
        import torch

        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(self.shadow[name])

    def state_dict(self) -> dict[str, Any]:
        return {n: t.detach().to("cpu", copy=True) for n, t in self.shadow.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        with torch.no_grad():
            for name, tensor in self.shadow.items():
                tensor.copy_(state[name])


@dataclass(frozen=True)
class Checkpointing:
    """Where a run keeps its resumable checkpoint (a cache folder beside the output, never
    inside an artifact) and which run it belongs to (`tag`: the artifact id)."""

    directory: Path
    tag: str

    @property
    def file(self) -> Path:
        return self.directory / CHECKPOINT_FILE


CHECKPOINT_FILE = "checkpoint.pt"
EpochEnd = Callable[["nn.Module"], dict[str, Any]]


def _free_precision(mixed_precision: str) -> None:
    """Let this run's Accelerator take `mixed_precision` in a process where an earlier run
    fixed another one: accelerate keeps one process-wide state and refuses to change its
    precision ("AcceleratorState has already been initialized"), which broke a second
    finetune with another `--precision`/`--dtype` in one process (`uqc run`, a notebook,
    a recipe under torchrun). A single process resets all of it; under torchrun or
    accelerate launch only the Accelerator's part, and the distributed part (PartialState:
    the process group and ranks the launcher set up) stays."""
    from accelerate.state import AcceleratorState

    from uqcompress.runtime.distributed import world_size

    if not AcceleratorState._shared_state:
        return
    if AcceleratorState().mixed_precision != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=world_size() == 1)


def train(
    model: nn.Module,
    loader: DataLoader,
    cfg: TrainConfig,
    loss_fn: LossFn = classification_loss,
    validate: ValidateFn | None = None,
    description: str = "training",
    *,
    epoch_end: EpochEnd | None = None,
    checkpoint: Checkpointing | None = None,
    source: str | None = None,
) -> TrainResult:
    """Train ``model`` in place; returns loss and validation curves and the per-epoch history.

    `validate` scores the model after every epoch (its metrics go into the history as
    `val_<name>`; with `cfg.select_best` the best epoch's weights are kept at the end, and
    `cfg.patience` stops a run that stopped improving); `epoch_end` adds its own values to
    each epoch's history row. Validation runs with the random number generators forked, so a
    run with validation takes the same training steps as one without. With `checkpoint` and
    `cfg.checkpoint_every`, a resumable checkpoint is written every so many optimizer steps;
    `cfg.resume` continues from it, and a finished run removes it.
    """
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, set_seed
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
    _check_starting_weights(model, source)
    set_seed(cfg.seed)
    generator = getattr(loader, "generator", None)  # the shuffling order's own generator
    # split_batches: --batch-size is the global batch, cut across processes, so a run on N
    # processes takes the same optimisation steps as a run on one.
    _free_precision(PRECISIONS[cfg.precision])
    accelerator = Accelerator(
        cpu=cfg.device == "cpu",
        mixed_precision=PRECISIONS[cfg.precision],
        dataloader_config=DataLoaderConfiguration(split_batches=True),
    )
    result = TrainResult()
    if sharding.requested(cfg.fsdp):
        # FSDP instead of accelerate's data-parallel wrapper; the optimizer is made after,
        # over the shards. Gradients are averaged over the processes as DDP's are.
        result.sharded_blocks = sharding.shard(model)
        result.sharded = True
    optimizer = make_optimizer(model, cfg)
    micro_per_epoch = len(loader)
    updates_per_epoch = math.ceil(micro_per_epoch / cfg.grad_accum)
    if cfg.max_steps is not None:
        total = cfg.max_steps
        epochs = math.ceil(total / updates_per_epoch)
    else:
        epochs = cfg.epochs
        total = epochs * updates_per_epoch
    warmup = max(1, math.ceil(cfg.warmup_ratio * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedule_factor(cfg.schedule, total, warmup)
    )
    if result.sharded:
        optimizer, loader, scheduler = accelerator.prepare(optimizer, loader, scheduler)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(
            model, optimizer, loader, scheduler
        )
    unwrapped = accelerator.unwrap_model(model)
    average = (
        WeightAverage(unwrapped, cfg.ema, cfg.ema_every, cfg.ema_start)
        if cfg.ema is not None
        else None
    )

    loop = _LoopState()
    if cfg.resume:
        if checkpoint is None or not checkpoint.file.is_file():
            raise ConfigError(
                "--resume: no checkpoint to resume from"
                + (f" in {checkpoint.directory}" if checkpoint is not None else ""),
                hint="run without --resume (add --checkpoint-every N to write checkpoints)",
            )
        run = _RunShape(
            total=total,
            epochs=epochs,
            micro_per_epoch=micro_per_epoch,
            updates_per_epoch=updates_per_epoch,
            grad_accum=cfg.grad_accum,
            validating=validate is not None,
            generator=generator,
        )
        loop = _load_checkpoint(
            checkpoint, unwrapped, optimizer, scheduler, result, average, run=run,
            sharded=result.sharded,
        )  # fmt: skip
        result.resumed_from_step = result.steps
        stderr.print(
            f"[dim]resuming from step {result.steps} (epoch {loop.epoch + 1}, "
            f"{loop.position}/{micro_per_epoch} batches in)[/dim]"
        )
    higher = SELECT_METRICS.get(cfg.select_best, False)
    earlier_seconds = loop.seconds  # spent before the checkpoint this run resumed from
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
    with progress, _note_checkpoint_on_interrupt(checkpoint):
        task = progress.add_task(
            description, total=total, completed=result.steps, loss=float("nan"), val=""
        )
        for epoch in range(loop.epoch, epochs):
            if loop.position == 0 or loop.epoch_generator is None:
                loop.epoch_generator = generator.get_state() if generator is not None else None
                loop.running, loop.seen = 0.0, 0
            elif generator is not None:
                generator.set_state(loop.epoch_generator)  # replay this epoch's order
            skip, loop.position, loop.epoch = loop.position, 0, epoch
            model.train()
            for i, batch in enumerate(_timed(loader, result)):
                if i < skip:
                    continue  # done before the checkpoint this run resumed from
                if result.steps >= total:
                    break
                interrupts.check()  # a Ctrl-C whose KeyboardInterrupt was lost stops here
                group_start = i - i % cfg.grad_accum
                group = min(cfg.grad_accum, micro_per_epoch - group_start)
                loss = loss_fn(model, batch)
                value = float(loss.detach())
                if not math.isfinite(value):
                    _diverged(value, epoch, result.steps, source)
                accelerator.backward(loss / group if group > 1 else loss)
                loop.running += value
                loop.seen += 1
                loop.position = i + 1
                if i + 1 - group_start < group:
                    continue  # accumulate the rest of this group's micro-batches
                if cfg.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                result.steps += 1
                if average is not None:
                    average.update(result.steps)
                progress.update(task, completed=result.steps, loss=loop.running / loop.seen)
                if (
                    checkpoint is not None
                    and cfg.checkpoint_every is not None
                    and result.steps % cfg.checkpoint_every == 0
                    and result.steps < total
                ):
                    loop.seconds = earlier_seconds + time.perf_counter() - start
                    _save_checkpoint(
                        checkpoint, unwrapped, optimizer, scheduler, result, loop, average,
                        sharded=result.sharded,
                    )  # fmt: skip
            loop.position = 0
            result.loss_curve.append(loop.running / max(1, loop.seen))
            row: dict[str, Any] = {
                "epoch": epoch + 1,
                "steps": result.steps,
                "lr": float(scheduler.get_last_lr()[0]),
                "train_loss": result.loss_curve[-1],
            }
            model.eval()
            # with --ema, validation and the best epoch's copy see the average
            applied = average.applied() if average is not None else contextlib.nullcontext()
            with torch.random.fork_rng(devices=_rng_devices()), applied:
                if epoch_end is not None:
                    row.update(epoch_end(unwrapped))
                metrics = validate(unwrapped) if validate is not None else {}
                improved = cfg.select_best != NO_SELECTION and _better(
                    metrics[cfg.select_best], loop.best_value, higher
                )
                if improved:  # with --ema, the average's weights are the ones kept
                    loop.best_state = _cpu_state(unwrapped)
            if validate is not None:
                result.val_curve.append(metrics)
                row.update({f"val_{k}": v for k, v in metrics.items()})
                shown = " ".join(f"val {k} {v:.4f}" for k, v in metrics.items())
                progress.update(task, val=shown)
            result.history.append(row)
            if cfg.select_best != NO_SELECTION:
                if improved:
                    loop.best_value, loop.bad_epochs = metrics[cfg.select_best], 0
                    result.best_epoch = epoch + 1
                else:
                    loop.bad_epochs += 1
                if cfg.patience is not None and loop.bad_epochs >= cfg.patience:
                    result.stopped_early = result.steps < total
                    break
            if result.steps >= total:
                break
            loop.epoch = epoch + 1
    accelerator.wait_for_everyone()
    if loop.best_state is not None:  # (whole tensors when it came from a checkpoint)
        unwrapped.load_state_dict(_laid_out(loop.best_state, unwrapped))
    elif average is not None:
        average.copy_to_model()
    unwrapped.eval()
    result.seconds = earlier_seconds + time.perf_counter() - start
    if checkpoint is not None and checkpoint.directory.exists():
        import shutil

        shutil.rmtree(checkpoint.directory, ignore_errors=True)  # the run is complete
    return result


def _check_starting_weights(model: nn.Module, source: str | None) -> None:
    """NonFiniteError before the first step if the weights to train from are NaN or infinite:
    no learning rate fixes that (the divergence message would say "lower --lr")."""
    from uqcompress.engine.finite import non_finite_weights, weights_summary
    from uqcompress.errors import NonFiniteError

    count, names = non_finite_weights(model)
    if count:
        summary = weights_summary(count, names).removeprefix("its weights hold ")
        raise NonFiniteError(
            f"the starting weights of {source or 'the model'} hold {summary}, before any "
            "training step",
            hint="train from a model with finite weights (re-import or re-create it)",
        )


def _diverged(value: float, epoch: int, steps: int, source: str | None) -> NoReturn:
    """The error of a non-finite training loss: training made it ("lower --lr") after some
    optimizer steps; before the first one the finite starting weights give it on this data."""
    from uqcompress.errors import NonFiniteError

    if steps == 0:
        raise NonFiniteError(
            f"the training loss is {value} on the first batches, before any training step: "
            f"{source or 'the model'} computes non-finite outputs on this data",
            hint="check the model on this data: uqc eval MODEL --data D names the example",
        )
    raise NonFiniteError(
        f"training diverged at epoch {epoch + 1}, after {steps} optimizer steps (loss {value})",
        hint="lower --lr",
    )


def _better(value: float, best: float | None, higher: bool) -> bool:
    """`value` beats the best so far (None: nothing yet)."""
    return best is None or (value > best if higher else value < best)


@contextlib.contextmanager
def _note_checkpoint_on_interrupt(checkpoint: Checkpointing | None) -> Iterator[None]:
    """On Ctrl-C, SIGTERM or a crash, say where the last checkpoint is and how to go on."""
    try:
        yield
    except BaseException:
        if checkpoint is not None and checkpoint.file.is_file():
            from uqcompress.runtime.console import stderr

            stderr.print(
                f"[yellow]a checkpoint of this run is in {checkpoint.directory}: run the same "
                "command with --resume to continue from it[/yellow]"
            )
        raise


def _cpu_state(model: nn.Module) -> dict[str, Any]:
    """A copy of the model's state dict on the CPU (a module's extra state, which need not be
    a tensor, deep-copied)."""
    import copy

    import torch

    return {
        k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
        for k, v in model.state_dict().items()
    }


def _laid_out(state: dict[str, Any], like: nn.Module | dict[str, Any]) -> dict[str, Any]:
    """A state of whole tensors (a checkpoint's) laid out as `like`'s own (a module's state
    dict, or a name -> tensor map): each process's shard where `like` is sharded (FSDP),
    else unchanged. Names `like` does not have stay as they are (load_state_dict names
    them)."""
    targets = like.state_dict() if not isinstance(like, dict) else like
    return {
        name: sharding.shard_like(value, targets[name]) if name in targets else value
        for name, value in state.items()
    }


def _whole_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict with each parameter's sharded moments gathered whole (a
    collective: every process, parameters in index order)."""
    per_param = {
        index: sharding.full_tensors(entry) for index, entry in sorted(state["state"].items())
    }
    return {"state": per_param, "param_groups": state["param_groups"]}


def _sharded_optimizer_state(state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """A checkpoint's optimizer state (whole tensors) with each moment laid out as its
    parameter is sharded; scalars (`step`) as they are."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param = {
        index: {
            key: sharding.shard_like(value, params[index]) if key != "step" else value
            for key, value in entry.items()
        }
        for index, entry in state["state"].items()
    }
    return {"state": per_param, "param_groups": state["param_groups"]}


def _rng_devices() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


@dataclass
class _LoopState:
    """Where the loop is, as a checkpoint records it."""

    epoch: int = 0  # 0-based, the epoch in progress
    position: int = 0  # micro-batches of that epoch already done
    epoch_generator: Any = None  # the shuffling generator's state when the epoch began
    running: float = 0.0  # the epoch's summed training loss so far
    seen: int = 0
    best_value: float | None = None
    best_state: dict[str, Any] | None = None
    bad_epochs: int = 0
    seconds: float = 0.0  # training time before the resume


def _save_checkpoint(
    checkpoint: Checkpointing,
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    result: TrainResult,
    loop: _LoopState,
    average: WeightAverage | None = None,
    *,
    sharded: bool = False,
) -> None:
    """Write the checkpoint atomically (a temp file renamed over the last one): weights,
    optimizer, scheduler, the weight average (--ema), every RNG state, the data order and
    position, curves so far. Rank 0 writes it. Sharded (FSDP), every process calls this:
    the shards are gathered into whole tensors first, so the file is the one a single
    process writes (and resumes with any number of processes)."""
    import random

    import numpy as np
    import torch

    from uqcompress.runtime.distributed import is_main_process

    if sharded:  # every process takes part in the gathering; rank 0 writes below
        model_state = sharding.full_tensors(model.state_dict())
        optimizer_state = _whole_optimizer_state(optimizer.state_dict())
        ema = sharding.full_tensors(average.state_dict()) if average is not None else None
        best = sharding.full_tensors(loop.best_state) if loop.best_state is not None else None
    if not is_main_process():
        return
    if not sharded:
        model_state, optimizer_state = _cpu_state(model), optimizer.state_dict()
        ema = average.state_dict() if average is not None else None
        best = loop.best_state
    name, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "tag": checkpoint.tag,
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "ema": ema,
        "rng_torch": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "rng_python": random.getstate(),
        "rng_numpy": [name, torch.from_numpy(np.array(keys)), position, has_gauss, cached],
        "loop": {
            "epoch": loop.epoch,
            "position": loop.position,
            "epoch_generator": loop.epoch_generator,
            "running": loop.running,
            "seen": loop.seen,
            "best_value": loop.best_value,
            "best_state": best,
            "bad_epochs": loop.bad_epochs,
            "seconds": loop.seconds,
        },
        "result": {
            "loss_curve": result.loss_curve,
            "val_curve": result.val_curve,
            "history": result.history,
            "steps": result.steps,
            "best_epoch": result.best_epoch,
        },
    }
    checkpoint.directory.mkdir(parents=True, exist_ok=True)
    partial = checkpoint.directory / (CHECKPOINT_FILE + ".partial")
    torch.save(state, partial)
    partial.replace(checkpoint.file)


def _load_checkpoint(
    checkpoint: Checkpointing,
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    result: TrainResult,
    average: WeightAverage | None = None,
    *,
    run: _RunShape | None = None,
    sharded: bool = False,
) -> _LoopState:
    """Restore what `_save_checkpoint` wrote; the loop state to continue from. Every field is
    checked against the run it claims to continue (`check_checkpoint`) before anything is
    restored: a checkpoint that does not fit is refused in one line (ConfigError)."""
    import random

    import numpy as np
    import torch

    from uqcompress.models.loading import first_line

    try:
        state = torch.load(checkpoint.file, map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file; torch's message spans many lines
        raise ConfigError(
            f"--resume: the checkpoint {checkpoint.file} cannot be read ({first_line(exc)})",
            hint=f"delete {checkpoint.directory} and run without --resume",
        ) from exc
    if not isinstance(state, dict) or state.get("tag") != checkpoint.tag:
        raise ConfigError(
            f"--resume: the checkpoint in {checkpoint.directory} belongs to another run "
            "(its inputs or options differ)",
            hint=f"resume with the options it was started with, or delete {checkpoint.directory}",
        )
    if average is not None and state.get("ema") is None:
        raise ConfigError(
            f"--resume: the checkpoint in {checkpoint.directory} has no weight average",
            hint=f"delete {checkpoint.directory} and run without --resume",
        )
    if run is not None:
        check_checkpoint(state, checkpoint, model, optimizer, scheduler, average, run)
    try:  # what the checks above cannot foresee: torch's multi-line error as one line
        model.load_state_dict(_laid_out(state["model"], model))
        optimizer.load_state_dict(
            _sharded_optimizer_state(state["optimizer"], optimizer)
            if sharded
            else state["optimizer"]
        )
        scheduler.load_state_dict(state["scheduler"])
        if average is not None:
            average.load_state_dict(_laid_out(state["ema"], average.shadow))
        torch.set_rng_state(state["rng_torch"])
        if state["rng_cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        python = state["rng_python"]
        random.setstate((python[0], tuple(python[1]), python[2]))
        name, keys, position, has_gauss, cached = state["rng_numpy"]
        np.random.set_state((name, keys.numpy(), position, has_gauss, cached))
        saved = state["result"]
        result.loss_curve = list(saved["loss_curve"])
        result.val_curve = list(saved["val_curve"])
        result.history = list(saved["history"])
        result.steps = int(saved["steps"])
        result.best_epoch = saved["best_epoch"]
        return _LoopState(**state["loop"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
        raise ConfigError(
            f"--resume: the checkpoint {checkpoint.file} cannot be restored ({first_line(exc)})",
            hint=f"delete {checkpoint.directory} and run without --resume",
        ) from exc


@dataclass(frozen=True)
class _RunShape:
    """What a checkpoint of this run must fit: its step counts and the loop's shape."""

    total: int  # optimizer steps of the whole run
    epochs: int
    micro_per_epoch: int  # batches per epoch
    updates_per_epoch: int  # optimizer steps per epoch
    grad_accum: int
    validating: bool  # validation runs after every epoch (val_curve grows with the epochs)
    generator: Any = None  # the loader's shuffling generator (its state's size)


# Per-parameter optimizer state each optimizer keeps (amsgrad adds max_exp_avg_sq).
_OPTIMIZER_STATE = {
    "AdamW": {"step", "exp_avg", "exp_avg_sq"},
    "Adam": {"step", "exp_avg", "exp_avg_sq"},
    "SGD": {"momentum_buffer"},
}
_TOP_KEYS = (
    "tag",
    "model",
    "optimizer",
    "scheduler",
    "ema",
    "rng_torch",
    "rng_cuda",
    "rng_python",
    "rng_numpy",
    "loop",
    "result",
)


def check_checkpoint(
    state: dict[str, Any],
    checkpoint: Checkpointing,
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    average: WeightAverage | None,
    run: _RunShape,
) -> None:
    """Refuse (ConfigError, one line) a checkpoint that does not continue this run: every key
    present; model, optimizer and weight-average tensors of this model's names and shapes,
    finite; optimizer hyperparameters as this run sets them; the step count within [0, total)
    and equal to the one the loop position implies; the scheduler at that step; RNG states of
    the types and sizes torch, numpy and Python use; the curves one entry per finished epoch.
    """
    import torch

    def refuse(problem: str) -> NoReturn:
        raise ConfigError(
            f"--resume: the checkpoint {checkpoint.file} {problem}; it does not continue this run",
            hint=f"delete {checkpoint.directory} and run without --resume",
        )

    missing = [k for k in _TOP_KEYS if k not in state]
    if missing:
        refuse(f"has no {', '.join(missing)}")
    _check_tensors(state["model"], _cpu_shapes(model.state_dict()), "model weights", refuse)
    if average is not None:
        _check_tensors(state["ema"], _cpu_shapes(average.state_dict()), "weight average", refuse)
    loop, saved = state["loop"], state["result"]
    if not isinstance(loop, dict) or set(loop) != set(_LoopState.__dataclass_fields__):
        refuse("has a malformed loop state")
    if not isinstance(saved, dict) or set(saved) != {
        "loss_curve",
        "val_curve",
        "history",
        "steps",
        "best_epoch",
    }:
        refuse("has a malformed result state")
    epoch, position, steps = loop["epoch"], loop["position"], saved["steps"]
    for name, value, low, high in (
        ("loop.epoch", epoch, 0, run.epochs - 1),
        ("loop.position", position, 0, run.micro_per_epoch),
        ("result.steps", steps, 0, run.total - 1),
        ("loop.seen", loop["seen"], 0, run.micro_per_epoch),
        ("loop.bad_epochs", loop["bad_epochs"], 0, run.epochs),
    ):
        if not _is_int(value) or not low <= value <= high:
            refuse(f"has {name} {value!r}, outside [{low}, {high}] for this run")
    implied = epoch * run.updates_per_epoch + math.ceil(position / run.grad_accum)
    if steps != implied:
        refuse(
            f"has result.steps {steps}, but epoch {epoch + 1} after {position} batches is step "
            f"{implied}"
        )
    if not _is_number(loop["running"]) or not math.isfinite(loop["running"]):
        refuse(f"has loop.running {loop['running']!r}, not a finite number")  # a loss sum
    if not _is_number(loop["seconds"]) or not math.isfinite(loop["seconds"]) or loop["seconds"] < 0:
        refuse(f"has loop.seconds {loop['seconds']!r}, not a finite number >= 0")
    if loop["best_value"] is not None and not (
        _is_number(loop["best_value"]) and math.isfinite(loop["best_value"])
    ):
        refuse(f"has loop.best_value {loop['best_value']!r}, not a finite number")
    if loop["best_state"] is not None:
        _check_tensors(loop["best_state"], _cpu_shapes(model.state_dict()), "best epoch", refuse)
    _check_generator(loop["epoch_generator"], run.generator, refuse)
    expected = {"loss_curve": epoch, "history": epoch, "val_curve": epoch if run.validating else 0}
    for name, length in expected.items():
        if not isinstance(saved[name], list) or len(saved[name]) != length:
            refuse(f"has a result.{name} that is not one entry per finished epoch ({length})")
    if not all(_is_number(v) and math.isfinite(v) for v in saved["loss_curve"]):
        refuse("has a non-finite training loss in result.loss_curve")
    best = saved["best_epoch"]
    if best is not None and (not _is_int(best) or not 1 <= best <= epoch):
        refuse(f"has result.best_epoch {best!r}, outside [1, {epoch}]")
    _check_optimizer(state["optimizer"], optimizer, steps, refuse)
    _check_scheduler(state["scheduler"], scheduler, steps, refuse)
    # the learning rate the next optimizer step uses is the optimizer's, not the scheduler's
    group_lrs = [g.get("lr") for g in state["optimizer"]["param_groups"]]
    if group_lrs != state["scheduler"]["_last_lr"]:
        refuse(
            f"has optimizer learning rates {group_lrs}, its schedule "
            f"{state['scheduler']['_last_lr']}"
        )
    _check_rng(state, refuse, torch)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cpu_shapes(tensors: dict[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """Each entry's shape (None: a module's extra state, which need not be a tensor)."""
    return {k: tuple(v.shape) if hasattr(v, "shape") else None for k, v in tensors.items()}


def _check_tensors(
    saved: Any,
    shapes: dict[str, tuple[int, ...] | None],
    what: str,
    refuse: Callable[[str], NoReturn],
) -> None:
    """Saved tensors under exactly `shapes`' names, of those shapes, floating ones finite."""
    import torch

    if not isinstance(saved, dict):
        refuse(f"has no {what} (found {type(saved).__name__})")
    missing = [k for k in shapes if k not in saved]
    extra = [k for k in saved if k not in shapes]
    if missing or extra:
        names = missing or extra
        refuse(
            f"{'lacks' if missing else 'has unknown'} {what} {names[0]!r}"
            + (f" and {len(names) - 1} more" if len(names) > 1 else "")
        )
    for name, shape in shapes.items():
        value = saved[name]
        if shape is None:
            continue
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            found = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            refuse(f"has {what} {name!r} of shape {found}, this run {list(shape)}")
        if torch.is_floating_point(value) and not bool(torch.isfinite(value).all()):
            refuse(f"has non-finite {what} in {name!r}")


def _check_generator(saved: Any, generator: Any, refuse: Callable[[str], NoReturn]) -> None:
    import torch

    if saved is None:
        return
    size = generator.get_state().numel() if generator is not None else None
    if (
        not isinstance(saved, torch.Tensor)
        or saved.dtype != torch.uint8
        or (size is not None and saved.numel() != size)
    ):
        refuse("has a shuffling-generator state that is not a torch generator's")


def _check_optimizer(
    saved: Any, optimizer: Any, steps: int, refuse: Callable[[str], NoReturn]
) -> None:
    """The groups, hyperparameters and per-parameter state of this run's optimizer."""
    import torch

    fresh = optimizer.state_dict()
    if not isinstance(saved, dict) or set(saved) != {"state", "param_groups"}:
        refuse("has no optimizer state")
    groups = saved["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(fresh["param_groups"]):
        refuse(f"has optimizer groups that are not this run's {len(fresh['param_groups'])}")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, (got, want) in enumerate(zip(groups, fresh["param_groups"], strict=True)):
        if not isinstance(got, dict) or got.get("params") != want["params"]:
            refuse(f"has optimizer group {index} over other parameters")
        for key, value in want.items():
            if key not in ("params", "lr") and got.get(key) != value:
                refuse(f"has optimizer {key} {got.get(key)!r} in group {index}, this run {value!r}")
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    keys = _OPTIMIZER_STATE.get(type(inner).__name__)
    if keys is not None and any(g.get("amsgrad") for g in fresh["param_groups"]):
        keys = keys | {"max_exp_avg_sq"}
    per_param = saved["state"]
    if not isinstance(per_param, dict) or (steps > 0 and keys and not per_param):
        refuse(f"has no optimizer state for its {steps} steps")
    for index, entry in per_param.items():
        if not _is_int(index) or not 0 <= index < len(params) or not isinstance(entry, dict):
            refuse(f"has optimizer state for parameter {index!r}, which this run does not have")
        if keys is not None and set(entry) != keys:
            refuse(
                f"has optimizer state {sorted(entry)} for parameter {index}, this optimizer "
                f"keeps {sorted(keys)}"
            )
        shape = tuple(params[index].shape)
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                refuse(f"has optimizer {key} of parameter {index} that is not a tensor")
            if key == "step":
                if value.numel() != 1 or not 0 <= float(value) <= steps:
                    refuse(
                        f"has optimizer step {value.tolist()} for parameter {index}, "
                        f"outside [0, {steps}]"
                    )
            elif tuple(value.shape) != shape:
                refuse(
                    f"has optimizer {key} of shape {list(value.shape)} for parameter {index}, "
                    f"this run {list(shape)}"
                )
            elif not bool(torch.isfinite(value).all()):
                refuse(f"has non-finite optimizer {key} for parameter {index}")


def _check_scheduler(
    saved: Any, scheduler: Any, steps: int, refuse: Callable[[str], NoReturn]
) -> None:
    """This run's schedule, at the checkpoint's step."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate's wrapper
    if not isinstance(saved, dict):
        refuse("has no scheduler state")
    if saved.get("last_epoch") != steps or saved.get("_step_count") != steps + 1:
        refuse(
            f"has scheduler last_epoch {saved.get('last_epoch')!r}, but it is at step {steps} "
            f"(last_epoch {steps})"
        )
    if saved.get("base_lrs") != list(inner.base_lrs):
        refuse(f"has scheduler base_lrs {saved.get('base_lrs')!r}, this run {inner.base_lrs}")
    lrs = [base * lam(steps) for base, lam in zip(inner.base_lrs, inner.lr_lambdas, strict=True)]
    last = saved.get("_last_lr")
    if (
        not isinstance(last, list)
        or len(last) != len(lrs)
        or not all(
            _is_number(a) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
            for a, b in zip(last, lrs, strict=True)
        )
    ):
        refuse(f"has learning rates {last!r}, this run's schedule gives {lrs} at step {steps}")


def _check_rng(state: dict[str, Any], refuse: Callable[[str], NoReturn], torch: Any) -> None:
    """RNG states of the types and sizes torch, CUDA, Python and numpy use."""
    cpu = state["rng_torch"]
    if (
        not isinstance(cpu, torch.Tensor)
        or cpu.dtype != torch.uint8
        or cpu.numel() != torch.get_rng_state().numel()
    ):
        refuse("has an rng_torch that is not torch's CPU generator state")
    cuda = state["rng_cuda"]
    if not isinstance(cuda, list) or not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda
    ):
        refuse("has an rng_cuda that is not a list of CUDA generator states")
    python = state["rng_python"]
    if not (
        isinstance(python, tuple | list)
        and len(python) == 3
        and python[0] == 3
        and isinstance(python[1], tuple | list)
        and len(python[1]) == 625
        and all(_is_int(v) and 0 <= v < 2**32 for v in python[1][:624])
        and _is_int(python[1][624])
        and 0 <= python[1][624] <= 624
        and (python[2] is None or _is_number(python[2]))
    ):
        refuse("has an rng_python that is not Python's random state (version 3, 625 words)")
    numpy = state["rng_numpy"]
    if not (
        isinstance(numpy, tuple | list)
        and len(numpy) == 5
        and numpy[0] == "MT19937"
        and isinstance(numpy[1], torch.Tensor)
        and numpy[1].numel() == 624
        and _is_int(numpy[2])
        and 0 <= numpy[2] <= 624
        and numpy[3] in (0, 1)
        and _is_number(numpy[4])
    ):
        refuse("has an rng_numpy that is not numpy's MT19937 state (624 words)")


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
    transform: Callable[[Any, bool], Any] | None = None,
    description: str = "finetune",
    checkpoint: Checkpointing | None = None,
    replace_head: bool = False,
    labels_hint: str | None = None,
) -> FineTuned:
    """Fine-tune a loaded classifier on labelled data with `train`.

    A head that was never trained (`head_untrained`), or any head with `replace_head`, is
    replaced by a fresh one sized by the data's classes, whose names it adopts (placeholder
    labels LABEL_i do too). `transform(loaded, new_head)` turns the label-checked model into
    the one to train (the SVE step builds its ensemble there); `new_head` says the head is
    fresh. `labels_hint` replaces the fix named when the data has labels the model does not
    know. `source` names the model in warnings. Validation reports accuracy, NLL, ECE and the
    training loss (mean member cross-entropy) after every epoch (`validation_metrics`).
    """
    from uqcompress.data.encoding import (
        encode,
        make_loader,
        record_max_length,
        record_text_input,
    )
    from uqcompress.data.labels import map_labels
    from uqcompress.engine.inference import predict_logits
    from uqcompress.models.loading import has_default_labels

    notes: dict[str, Any] = {}
    warnings: list[str] = []
    if head_untrained or replace_head:
        # An untrained head's size and label names came from the checkpoint's config, not
        # from any task: the training data decides both.
        from uqcompress.models.surgery import replace_classifier

        count = _class_count(train_data)
        replaced = list(loaded.labels)
        replace_classifier(loaded, [f"LABEL_{i}" for i in range(count)], cfg.seed)
        if head_untrained:
            notes["classifier_initialised"] = True
            warnings.append(
                f"{source} had no trained classifier; a new head for {count} classes "
                f"(from {train_data.spec}) was trained from scratch"
            )
        else:
            notes["classifier_replaced"] = _preview_labels(replaced)
    try:
        mapping = map_labels(train_data, loaded.labels, has_default_labels(loaded.labels))
    except DataError as exc:
        if labels_hint is None:
            raise
        raise DataError(exc.message, hint=labels_hint) from exc
    if mapping.adopted_labels is not None:
        _adopt_labels(loaded, mapping.adopted_labels)
        notes["labels_from_data"] = True
        warnings.append(
            f"the model had placeholder labels; adopted {len(loaded.labels)} label names "
            f"from {train_data.spec}: {', '.join(loaded.labels)}"
        )
    if transform is not None:
        loaded = transform(loaded, head_untrained or replace_head)
    # training decides what text the model reads: its data may be pairs whatever the model
    # read before (a warning says so); validation data must then match
    encoded = encode(
        train_data,
        loaded,
        mapping.ids,
        max_length,
        augment=cfg.augment,
        workers=cfg.workers,
        check_pairs=False,
    )
    configs = {id(loaded.config): loaded.config, id(loaded.model.config): loaded.model.config}
    changed = [record_text_input(config, train_data) for config in configs.values()]
    for config in configs.values():  # what `uqc export` deploys by default
        record_max_length(config, loaded, max_length)
    if changed[0] is not None:
        warnings.append(changed[0])
    if encoded.truncated:
        notes["truncated"] = encoded.truncated
        warnings.append(f"{encoded.truncated} training texts were truncated to the max length")
    loader = make_loader(encoded, cfg.batch_size, shuffle=True, seed=cfg.seed)

    validate: Any = None
    if val_data is not None:
        val_ids = map_labels(val_data, loaded.labels, placeholder=False).ids
        val_encoded = encode(val_data, loaded, val_ids, max_length, workers=cfg.workers)

        def validate(model: Any) -> dict[str, float]:
            logits = predict_logits(model, val_encoded, device=cfg.device).member_logits
            return validation_metrics(logits, val_ids)

    result = train(
        loaded.model,
        loader,
        cfg,
        validate=validate,
        description=f"{description} {loaded.family.name}",
        checkpoint=checkpoint,
        source=source,
    )
    if result.sharded:  # every process gathers the full weights into a plain module
        loaded.model = sharding.unsharded(loaded, loaded.model)
    loaded.model.to("cpu")
    return FineTuned(loaded=loaded, result=result, notes=notes, warnings=warnings)


def _timed(loader: Any, result: TrainResult) -> Iterator[Any]:
    """The loader's batches, adding the time spent waiting for each to `result`."""
    iterator = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            result.data_wait_seconds += time.perf_counter() - start
            return
        result.data_wait_seconds += time.perf_counter() - start
        yield batch


def validation_metrics(member_logits: Any, labels: Any) -> dict[str, float]:
    """What every epoch's validation reports: accuracy, NLL and ECE of the mean of the member
    softmaxes, and `loss`, the training loss on the validation data (the mean of the members'
    cross-entropies, as `classification_loss`).

    Shape: member_logits `[N, M, C]` (numpy), labels `[N]` -> floats.
    """
    import numpy as np

    from uqcompress.uq.metrics import accuracy, ece, nll, softmax

    logits = np.asarray(member_logits, dtype=np.float64)
    probs = softmax(logits)  # [N, M, C]
    mean = probs.mean(axis=1)  # [N, C]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # [N, M, C]
    picked = np.take_along_axis(log_probs, np.asarray(labels)[:, None, None], axis=-1)  # [N, M, 1]
    return {
        "acc": accuracy(mean, labels),
        "nll": nll(mean, labels),
        "ece": ece(mean, labels),
        "loss": float(-picked.mean()),
    }


def _adopt_labels(loaded: Any, labels: list[str]) -> None:
    loaded.labels = list(labels)
    loaded.model.config.id2label = dict(enumerate(labels))
    loaded.model.config.label2id = {name: i for i, name in enumerate(labels)}


def _preview_labels(labels: list[str], limit: int = 10) -> str:
    """The label names of a replaced head, for the summary (the first `limit`)."""
    shown = ",".join(labels[:limit])
    return shown + (f",... ({len(labels)} labels)" if len(labels) > limit else "")


def _class_count(data: Any) -> int:
    """How many classes the training data names (its class names, else distinct labels)."""
    if data.label_names is not None:
        return len(data.label_names)
    return len({str(v) for v in data.labels or []})
