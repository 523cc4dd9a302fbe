"""DIRECTOR distillation (docs/methods/director.md): a student (`models/director_model.py`)
learns the teacher's block stack as a reverse diffusion process.

Here: the teacher's states x_0 .. x_K recorded under teacher forcing (`Family.mlp_entry`'s
inputs), the Gaussian losses per step (L1) and the cross-entropy of a sampled roll-out (L2),
parameter counts, and building a student for a teacher. The training loop around them is
`methods/director_distill.py`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from uqcompress.errors import ConfigError
from uqcompress.models.director_model import (
    DirectorModel,
    DirectorSpec,
    director_family,
    student_trainable,
)
from uqcompress.models.families import Family
from uqcompress.models.families.base import additive_mask

if TYPE_CHECKING:
    from collections.abc import Iterator

    from uqcompress.models.loading import LoadedModel

LOSSES = ("kl", "nll", "mse")


# --- the teacher, re-partitioned -----------------------------------------------------------


@dataclass(frozen=True)
class TeacherStates:
    """Shape: states `[K + 1, B, T, d]` (x_0 .. x_K), logits `[B, C]`, mask `[B, T]` or None."""

    states: torch.Tensor
    logits: torch.Tensor
    mask: torch.Tensor | None


@torch.no_grad()
def record_teacher_states(
    teacher: nn.Module, family: Family | str, replace_last: int, inputs: dict[str, Any]
) -> TeacherStates:
    """Run the frozen teacher once, recording x_0 .. x_K (teacher forcing needs all of them)."""
    anatomy = director_family(family)
    layers = anatomy.blocks(teacher)
    first = len(layers) - replace_last
    captured: list[torch.Tensor] = []
    handles = []

    def keep_input(_module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(args[0].detach())

    def keep_output(_module: nn.Module, _args: Any, output: Any) -> None:
        captured.append((output[0] if isinstance(output, tuple) else output).detach())

    if first > 0:
        handles.append(layers[first - 1].register_forward_hook(keep_output))
    for layer in layers[first:]:
        handles.append(anatomy.mlp_entry(layer).register_forward_pre_hook(keep_input))
    try:
        logits = teacher(**inputs).logits
    finally:
        for handle in handles:
            handle.remove()
    if first == 0:
        # x_0 is the embeddings' output, computed through the anatomy (a family's embeddings
        # may be more than one module, e.g. ELECTRA's projection): exactly the model's own.
        captured.insert(0, anatomy.embed(anatomy.embeddings(teacher), inputs)[0].detach())
    return TeacherStates(
        states=torch.stack(captured), logits=logits, mask=inputs.get("attention_mask")
    )


# --- losses --------------------------------------------------------------------------------


def gaussian_kl(
    mean_p: torch.Tensor, std_p: torch.Tensor, mean_q: torch.Tensor, std_q: torch.Tensor
) -> torch.Tensor:
    """KL(N(mean_p, std_p^2) || N(mean_q, std_q^2)) per element (diagonal Gaussians).

    Shape: any broadcastable shapes -> elementwise KL.
    """
    return (
        torch.log(std_q / std_p)
        + (std_p.pow(2) + (mean_p - mean_q).pow(2)) / (2 * std_q.pow(2))
        - 0.5
    )


def gaussian_nll(target: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Negative log-density of `target` under N(mean, std^2) per element, constant dropped:
    the KL against a point-mass teacher (a deterministic layer). Shape: elementwise."""
    return torch.log(std) + (target - mean).pow(2) / (2 * std.pow(2))


@dataclass(frozen=True)
class LossWeights:
    loss: str = "kl"  # kl (NLL for deterministic teachers) | nll | mse
    mean: float = 1.0
    std: float = 0.1
    ce: float = 1.0


def _masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over valid tokens. Shape: values `[B, T, d]`, mask `[B, T]` or None -> scalar."""
    if mask is None:
        return values.mean()
    weights = mask[:, :, None].to(values.dtype)
    return (values * weights).sum() / (weights.sum() * values.shape[-1])


def distillation_loss(
    model: DirectorModel,
    teacher: TeacherStates,
    weights: LossWeights,
    teacher_std: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """L1 averaged over the K steps (teacher forcing), and its per-step values `[K]`.

    kl: closed-form KL(teacher || student) when the teacher has a std; plain BERT/ViT layers
    are deterministic, so kl falls back to the Gaussian NLL of the teacher's state. mse: the
    research code's lambda_mean MSE(mean) + lambda_std MSE(std, teacher std).
    """
    mask = teacher.mask
    # the transition's dtype (float32 under a bfloat16 teacher, --dtype): the teacher's
    # states are widened to it, so the loss and its gradients are float32 too
    dtype = next(model.transition.parameters()).dtype
    additive = additive_mask(mask, dtype)
    per_step = []
    for step in range(model.steps):
        source = teacher.states[step].to(dtype)
        target = teacher.states[step + 1].to(dtype)
        mean, std = model.transition(source, step, additive)
        reference_std = teacher_std[step] if teacher_std is not None else torch.zeros_like(std)
        if weights.loss == "mse":
            value = weights.mean * _masked_mean((mean - target).pow(2), mask)
            value = value + weights.std * _masked_mean((std - reference_std).pow(2), mask)
        elif weights.loss == "kl" and teacher_std is not None:
            value = weights.mean * _masked_mean(gaussian_kl(target, reference_std, mean, std), mask)
        else:
            value = weights.mean * _masked_mean(gaussian_nll(target, mean, std), mask)
        per_step.append(value)
    values = torch.stack(per_step)
    return values.mean(), values.detach()


@dataclass(frozen=True)
class BatchSplit:
    """A training batch cut across processes (the loop's `split_batches`): each process
    holds a contiguous run of the global batch's rows, in rank order, padded to its own
    longest example on the side the tokenizer pads."""

    pad_left: bool


def sampled_ce(
    model: DirectorModel,
    inputs: dict[str, Any],
    labels: torch.Tensor,
    generator_seed: int,
    split: BatchSplit | None = None,
) -> torch.Tensor:
    """L2: cross-entropy of one sampled roll-out from x_0 (reparameterised).

    With `split` (a training batch under several processes) every process draws the noise
    of the whole global batch and keeps its own rows and token positions, so each example
    gets the draw it gets in one process and N processes train what one does.
    """
    x0, mask = model.start_state(inputs)
    generator = torch.Generator(device=x0.device).manual_seed(generator_seed)
    noise = _rollout_noise(model.steps, x0, generator, split).to(x0.dtype)
    logits = model.head(model.rollout(x0, mask, noise), inputs.get("attention_mask"))
    return F.cross_entropy(logits, labels)


def _rollout_noise(
    steps: int, x0: torch.Tensor, generator: torch.Generator, split: BatchSplit | None
) -> torch.Tensor:
    """The roll-out's draws for this process's rows. Shape: x0 `[B, T, d]` -> `[K, B, T, d]`.

    Split: the global batch is the processes' rows stacked in rank order and padded to the
    longest of them, as one process would collate it; this process's rows are its slice,
    and its T positions the global batch's first T (right padding) or last T (left).
    """
    from uqcompress.runtime.distributed import all_gather_objects, rank, world_size

    rows, width = int(x0.shape[0]), int(x0.shape[1])
    if split is None or world_size() == 1:
        return torch.randn(steps, *x0.shape, generator=generator, device=x0.device)
    shapes = all_gather_objects((rows, width))
    first = sum(r for r, _ in shapes[: rank()])
    total_rows, total_width = sum(r for r, _ in shapes), max(w for _, w in shapes)
    draws = torch.randn(
        steps, total_rows, total_width, x0.shape[2], generator=generator, device=x0.device
    )
    start = total_width - width if split.pad_left else 0
    return draws[:, first : first + rows, start : start + width]


@contextmanager
def no_dropout(module: nn.Module) -> Iterator[None]:
    """Eval mode inside (the frozen teacher's states must not be noisy)."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def parameter_counts(teacher: nn.Module, student: DirectorModel) -> dict[str, int]:
    """Teacher vs student parameters (the student includes the embeddings and head it keeps)."""
    return {
        "teacher": sum(p.numel() for p in teacher.parameters()),
        "student": sum(p.numel() for p in student.parameters()),
        "transition": sum(p.numel() for p in student.transition.parameters()),
    }


def build_student(
    loaded: LoadedModel,
    replace_last: int | None,
    depth: int,
    samples: int,
    seed: int,
    train_head: bool = True,
) -> DirectorModel:
    """A student for `loaded` (the teacher is copied, never changed)."""
    layers = int(loaded.config.num_hidden_layers)
    k = layers if replace_last is None else replace_last
    if not 1 <= k <= layers:
        raise ConfigError(
            f"--replace-last {k} is outside 1..{layers} (the teacher's depth)",
            hint=f"pass --replace-last {layers} (every layer) or fewer",
        )
    if depth < 1:
        raise ConfigError(f"--depth {depth} must be at least 1", hint="pass --depth 1")
    if samples < 1:
        raise ConfigError(f"--samples {samples} must be at least 1", hint="pass --samples 10")
    spec = DirectorSpec(
        replace_last=k, depth=depth, samples=samples, seed=seed, train_head=train_head
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        student = DirectorModel(loaded.model, loaded.family, spec)
    student_trainable(student, train_head)
    # What trains stays float32 in a half-precision teacher (--dtype): the transition (made
    # new, float32) and, when it trains, the head; the frozen copies keep the teacher's dtype.
    if train_head:
        for name in [*(f"last_{n}" for n in student._tail_names), *student._head_names]:
            getattr(student, name).float()
    return student.eval()  # inference mode (seeded noise) until a training loop says otherwise
