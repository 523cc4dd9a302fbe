"""What the scorers share: head counts and `[L, H]` padding, min-max, eval mode, batch
splitting, the mean loss, summing over processes, and the forward/backward passes with gates.

Conventions (every scorer follows them): a scorer returns a float32 `[L, H]` tensor on CPU
(layer, head); higher means more important, i.e. kept first by `methods/pruning.py`. Head counts
come from the model itself (`models.head_gates.heads_per_layer`), never from
`config.num_attention_heads`, so an already pruned model scores its *current* heads: H is the
largest per-layer count, and the slots `h >= H_l` of a layer with fewer heads are NaN ("no such
head"; `absent_slots`), which `methods/pruning.py` checks and never selects.

Data arrive as an iterable of batch dicts (what `data.encoding.make_loader` yields): `"labels"`
plus the model's inputs; text batches carry an `attention_mask` whose 0s mark padding, and
padding is excluded from every per-token quantity. The loss is the mean cross-entropy of
`model(**inputs).logits` against `batch["labels"]`. Models run in eval mode (no dropout) and the
caller's train/eval flags are restored afterwards.

Data-parallel runs: every data-driven scorer takes `gather`, a function returning every
process's tensor concatenated along dim 0 in rank order, identically on every process
(`runtime.distributed.all_gather_cat`). Each process then passes its own shard of whole
batches, and the per-process sums (gradient magnitudes, entropies, token and example counts,
losses, OOD scores) are combined before anything is divided or compared, so the scores equal a
one-process run's over all the batches (up to float summation order). None: one process.

Heads are reached only through `models.head_gates` (gates and captures on the attention output
projection), so every family that `models/families` describes works unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from uqcompress.errors import ConfigError, DataError
from uqcompress.methods.scoring.scorer import Batch, Gather, Progress
from uqcompress.models.head_gates import HeadGates, attention_probabilities, heads_per_layer

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel

NORM_SCOPES = ("global", "layer")


def head_counts(loaded: LoadedModel) -> list[int]:
    """The model's current head count per layer (uneven after pruning); refuses a model
    with no head left anywhere (nothing to score)."""
    counts = heads_per_layer(loaded)
    if not counts or max(counts) < 1:
        raise ConfigError(
            f"this model has no attention heads left to score ({counts} heads per layer)",
            hint="score a model that still has heads (prune less, or score before pruning)",
        )
    return counts


def absent_slots(counts: list[int]) -> Tensor:
    """Which `[L, H]` score slots name no head (h >= H_l), H = max(counts).

    Shape: -> `[L, H]` bool.
    """
    width = max(counts) if counts else 0
    return torch.arange(width)[None, :] >= torch.tensor(counts)[:, None]


def pad_rows(rows: list[Tensor], counts: list[int]) -> Tensor:
    """Per-layer score rows `[H_l]` -> one `[L, max H_l]` tensor, NaN in the absent slots.

    Shape: rows `[H_l]` each -> `[L, H]` (the rows' dtype, at least float32), on CPU.
    """
    if len(rows) != len(counts) or any(r.numel() != c for r, c in zip(rows, counts, strict=True)):
        raise ValueError(f"score rows of sizes {[r.numel() for r in rows]} for heads {counts}")
    if not rows:
        return torch.full((0, 0), math.nan)
    dtype = torch.promote_types(rows[0].dtype, torch.float32)
    # Padded where the rows live, then one copy to the CPU (not one device sync per layer).
    padded = torch.nn.utils.rnn.pad_sequence(
        [row.detach().reshape(-1).to(dtype) for row in rows],
        batch_first=True,
        padding_value=math.nan,
    )
    return padded.to("cpu")


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration; every module's own flag is restored after,
    because a caller may hold a model with, e.g., a frozen part deliberately left in eval."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def split_batch(
    batch: Batch, device: torch.device, need_labels: bool = True
) -> tuple[dict[str, Any], Tensor]:
    """Model inputs and labels of one batch, on the model's device.

    Shape: labels `[B]` (an empty tensor when the batch has none and none are needed).
    """
    inputs = {
        k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in batch.items() if k != "labels"
    }
    labels = batch.get("labels")
    if labels is None:
        if need_labels:
            raise DataError(
                "head scoring needs labelled batches (a 'labels' entry per batch); got "
                f"a batch with keys {sorted(batch)}",
                hint="score on a labelled dataset, e.g. the training split (--data)",
            )
        return inputs, torch.empty(0, dtype=torch.long, device=device)
    return inputs, torch.as_tensor(labels).to(device=device, dtype=torch.long)


def token_mask(inputs: Mapping[str, Any], batch: int, tokens: int) -> Tensor:
    """Which positions are real tokens: the text attention mask, or all of them for images.

    Shape: `[B, T]` bool, on the inputs' device.
    """
    mask = inputs.get("attention_mask")
    if isinstance(mask, Tensor) and tuple(mask.shape) == (batch, tokens):
        return mask.to(torch.bool)
    device = next((v.device for v in inputs.values() if isinstance(v, Tensor)), None)
    return torch.ones(batch, tokens, dtype=torch.bool, device=device)


def _loss_dtype(logits: Tensor) -> torch.dtype:
    # Losses in at least float32 (bf16/fp16 models), float64 stays float64 for exact tests.
    return torch.promote_types(logits.dtype, torch.float32)


def mean_nll(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the batch.

    Shape: logits `[B, C]`, labels `[B]` -> scalar.
    """
    return F.cross_entropy(logits.to(_loss_dtype(logits)), labels)


def minmax(scores: Tensor, scope: str = "global") -> Tensor:
    """Min-max normalise to [0, 1], over all heads (`global`) or within each layer (`layer`).

    A constant group (max == min) normalises to zeros: nothing in it is more important than
    anything else, and zeros keep the result finite. NaN slots (absent heads of a pruned
    layer) take no part in the minimum and maximum and stay NaN.

    Shape: `[L, H]` -> `[L, H]`.
    """
    check_option("norm_scope", scope, NORM_SCOPES, "--norm-scope")
    # Keep dims so the same arithmetic serves both scopes: [1, 1] (global) or [L, 1] (layer).
    dims = (0, 1) if scope == "global" else (1,)
    absent = torch.isnan(scores)
    low = torch.where(absent, math.inf, scores).amin(dim=dims, keepdim=True)
    high = torch.where(absent, -math.inf, scores).amax(dim=dims, keepdim=True)
    span = high - low  # -inf for an all-absent group: then "constant", i.e. zeros (then NaN)
    present = span > 0
    safe_span = torch.where(present, span, torch.ones_like(span))
    safe_low = torch.where(torch.isfinite(low), low, torch.zeros_like(low))
    result = torch.where(present, (scores - safe_low) / safe_span, torch.zeros_like(scores))
    return torch.where(absent, scores, result)


def sum_over_processes(value: Tensor, gather: Gather | None) -> Tensor:
    """The sum of `value` over the processes of a data-parallel run (itself for one).

    Shape: any -> the same shape.
    """
    return value if gather is None else gather(value[None]).sum(dim=0)


def check_option(name: str, value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise ConfigError(
            f"unknown {name} {value!r}; expected one of {', '.join(allowed)}",
            hint=f"pass {flag} {' or '.join(allowed)}",
        )


@dataclass
class Backward:
    """What one forward + backward pass of the mean loss gives the scorers.

    Shape: mask `[B, T]` bool; gate_grad `[L, H]` (NaN in absent slots, see `pad_rows`);
    head_inputs / head_grads: per layer `[B, T, H_l*d]`; attentions: per layer
    `[B, H_l, T, T]` (None for a layer with no heads).
    """

    mask: Tensor
    gate_grad: Tensor | None = None
    head_inputs: list[Tensor] | None = None
    head_grads: list[Tensor] | None = None
    attentions: list[Tensor | None] | None = None


def counted(batches: Sequence[Batch], progress: Progress | None) -> Iterator[Batch]:
    """`batches`, reporting (done, total) to `progress` after each one is used."""
    for done, batch in enumerate(batches, 1):
        yield batch
        if progress is not None:
            progress(done, len(batches))


def backward_passes(
    loaded: LoadedModel, batches: Iterable[Batch], *, per_token: bool
) -> Iterator[Backward]:
    """One forward/backward of the mean batch loss per batch, with gates g = 1 attached.

    `per_token=False`: the gradient w.r.t. the gates (Michel/Taylor). `per_token=True`: the
    head outputs A feeding each output projection, their gradients, and the attention
    probabilities (HIES); the caller must have switched to eager attention.
    """
    model = loaded.model
    device = model_device(model)
    counts = head_counts(loaded)
    num_layers = len(counts)
    parts = loaded.family.attention_layers(model)
    captured: dict[int, Tensor] = {}

    def capture(layer: int) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            captured[layer] = args[0]

        return hook

    # The gates are autograd leaves; the capture hook is registered after the gate hook, so it
    # sees the gated tensor g * A. At g = 1 that tensor equals A and d(loss)/d(g*A) = dL/dA, and
    # it is part of the graph even when the model's parameters are frozen (requires_grad off).
    with eval_mode(model), HeadGates(loaded, requires_grad=True) as gates:
        handles = [p.output.register_forward_pre_hook(capture(i)) for i, p in enumerate(parts)]
        try:
            for batch in batches:
                inputs, labels = split_batch(batch, device)
                captured.clear()
                with torch.enable_grad():
                    if per_token:
                        outputs = model(**inputs, output_attentions=True)
                    else:
                        outputs = model(**inputs)
                    loss = mean_nll(outputs.logits, labels)
                    heads = [captured[i] for i in range(num_layers)]
                    targets = heads if per_token else gates.gates
                    # autograd.grad, not .backward(): nothing accumulates in parameter .grad.
                    grads = torch.autograd.grad(loss, targets, allow_unused=True)
                grads = tuple(
                    torch.zeros_like(t) if g is None else g
                    for t, g in zip(targets, grads, strict=True)
                )
                size, tokens = heads[0].shape[0], heads[0].shape[1]
                mask = token_mask(inputs, size, tokens)
                if per_token:
                    yield Backward(
                        mask=mask,
                        head_inputs=[h.detach() for h in heads],
                        head_grads=list(grads),
                        attentions=_attentions(loaded, outputs, counts),
                    )
                else:
                    yield Backward(mask=mask, gate_grad=pad_rows(list(grads), counts))
        finally:
            for handle in handles:
                handle.remove()


def _attentions(loaded: LoadedModel, outputs: Any, counts: list[int]) -> list[Tensor | None]:
    """Per layer the attention probabilities `[B, H_l, T, T]`, None for a layer left with no
    heads (its stand-in module attends to nothing, so it returns none)."""
    if min(counts) > 0:
        return [a.detach() for a in attention_probabilities(loaded, outputs)]
    got = list(getattr(outputs, "attentions", None) or [])
    present = [layer for layer, count in enumerate(counts) if count > 0]
    if len(got) == len(present) and all(a is not None for a in got):
        # families whose output recorder skips layers that return no weights (ViT)
        by_layer: list[Tensor | None] = [None] * len(counts)
        for layer, attention in zip(present, got, strict=True):
            by_layer[layer] = attention.detach()
        return by_layer
    if len(got) != len(counts) or any(got[layer] is None for layer in present):
        attention_probabilities(loaded, outputs)  # raises its one-line explanation
    return [None if a is None else a.detach() for a in got]
