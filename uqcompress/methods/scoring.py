"""Attention-head importance scores: Taylor (Michel et al.), HIES, HeadMap, greedy circuit, L2,
random.

Every scorer returns a float32 `[L, H]` tensor on CPU (layer, head); higher means more
important, i.e. kept first by `methods/pruning.py`. Head counts come from the model itself
(`models.gates.heads_per_layer`), never from `config.num_attention_heads`, so an already
pruned model scores its *current* heads: H is the largest per-layer count, and the slots
`h >= H_l` of a layer with fewer heads are NaN ("no such head"; `absent_slots`), which
`methods/pruning.py` checks and never selects.

Data arrive as an iterable of batch dicts (what `data.encoding.make_loader` yields): `"labels"`
plus the model's inputs; text batches carry an `attention_mask` whose 0s mark padding, and
padding is excluded from every per-token quantity here. The loss is the mean cross-entropy of
`model(**inputs).logits` against `batch["labels"]`. Models run in eval mode (no dropout) and the
caller's train/eval flags are restored afterwards.

Data-parallel runs: every data-driven scorer takes `gather`, a function returning every
process's tensor concatenated along dim 0 in rank order, identically on every process
(`runtime.distributed.all_gather_cat`). Each process then passes its own shard of whole
batches, and the per-process sums (gradient magnitudes, entropies, token and example counts,
losses, OOD scores) are combined before anything is divided or compared, so the scores equal a
one-process run's over all the batches (up to float summation order). None: one process.

Heads are reached only through `models.gates` (gates and captures on the attention output
projection), so every family that `models/families` describes works unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from uqcompress.errors import ConfigError, DataError
from uqcompress.models.head_gates import (
    HeadGates,
    attention_probabilities,
    eager_attention,
    head_dim,
    heads_per_layer,
)
from uqcompress.uq.functional import auroc, entropy

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel

__all__ = [
    "HIS_ABS",
    "NORM_SCOPES",
    "absent_slots",
    "attention_entropy",
    "circuit_evaluations",
    "circuit_scores",
    "example_losses",
    "gate_gradient",
    "head_counts",
    "headmap_evaluations",
    "headmap_scores",
    "hies_scores",
    "l2_scores",
    "lowest_loss",
    "minmax",
    "pad_rows",
    "random_head_scores",
    "random_scores",
    "taylor_scores",
]

Batch = Mapping[str, Any]
Progress = Callable[[int, int], None]
Gather = Callable[[Tensor], Tensor]  # [n_r, ...] per process -> [sum n_r, ...], rank order

HIS_ABS = ("sample", "batch")
NORM_SCOPES = ("global", "layer")


# --------------------------------------------------------------------------- shared helpers


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


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration; every module's own flag is restored after,
    because a caller may hold a model with, e.g., a frozen part deliberately left in eval."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def _split(
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


def _token_mask(inputs: Mapping[str, Any], batch: int, tokens: int) -> Tensor:
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


def _mean_nll(logits: Tensor, labels: Tensor) -> Tensor:
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
    _check_option("norm_scope", scope, NORM_SCOPES, "--norm-scope")
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


def _sum_over_processes(value: Tensor, gather: Gather | None) -> Tensor:
    """The sum of `value` over the processes of a data-parallel run (itself for one).

    Shape: any -> the same shape.
    """
    return value if gather is None else gather(value[None]).sum(dim=0)


def _check_option(name: str, value: str, allowed: tuple[str, ...], flag: str) -> None:
    if value not in allowed:
        raise ConfigError(
            f"unknown {name} {value!r}; expected one of {', '.join(allowed)}",
            hint=f"pass {flag} {' or '.join(allowed)}",
        )


@dataclass
class _Backward:
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


def _backward_passes(
    loaded: LoadedModel, batches: Iterable[Batch], *, per_token: bool
) -> Iterator[_Backward]:
    """One forward/backward of the mean batch loss per batch, with gates g = 1 attached.

    `per_token=False`: the gradient w.r.t. the gates (Michel/Taylor). `per_token=True`: the
    head outputs A feeding each output projection, their gradients, and the attention
    probabilities (HIES); the caller must have switched to eager attention.
    """
    model = loaded.model
    device = _device(model)
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
    with _eval_mode(model), HeadGates(loaded, requires_grad=True) as gates:
        handles = [p.output.register_forward_pre_hook(capture(i)) for i, p in enumerate(parts)]
        try:
            for batch in batches:
                inputs, labels = _split(batch, device)
                captured.clear()
                with torch.enable_grad():
                    if per_token:
                        outputs = model(**inputs, output_attentions=True)
                    else:
                        outputs = model(**inputs)
                    loss = _mean_nll(outputs.logits, labels)
                    heads = [captured[i] for i in range(num_layers)]
                    targets = heads if per_token else gates.gates
                    # autograd.grad, not .backward(): nothing accumulates in parameter .grad.
                    grads = torch.autograd.grad(loss, targets, allow_unused=True)
                grads = tuple(
                    torch.zeros_like(t) if g is None else g
                    for t, g in zip(targets, grads, strict=True)
                )
                size, tokens = heads[0].shape[0], heads[0].shape[1]
                mask = _token_mask(inputs, size, tokens)
                if per_token:
                    yield _Backward(
                        mask=mask,
                        head_inputs=[h.detach() for h in heads],
                        head_grads=list(grads),
                        attentions=_attentions(loaded, outputs, counts),
                    )
                else:
                    yield _Backward(mask=mask, gate_grad=pad_rows(list(grads), counts))
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


# --------------------------------------------------------------------------- Taylor / Michel


def gate_gradient(loaded: LoadedModel, batch: Batch) -> Tensor:
    """Signed gradient dL/dg of the mean batch loss w.r.t. every head gate, at g = 1.

    This is the quantity whose absolute value `taylor_scores` accumulates; exposed so that it
    can be checked against finite differences.

    Shape: -> `[L, H]` float32 on CPU.
    """
    (result,) = list(_backward_passes(loaded, [batch], per_token=False))
    assert result.gate_grad is not None
    return result.gate_grad.float().cpu()


def taylor_scores(
    loaded: LoadedModel,
    batches: Iterable[Batch],
    *,
    layer_l2: bool = False,
    global_minmax: bool = False,
    gather: Gather | None = None,
) -> Tensor:
    """Michel et al. (2019) head importance, as in the HF bertology reference.

    I_{l,h} = (sum over batches of |dL_batch / dg_{l,h}|) / (number of non-pad tokens seen),
    with L_batch the mean cross-entropy of the batch and g the head gates at 1. The absolute
    value is taken per batch (the reference's `head_mask.grad.abs()`; with batch size 1 it is
    per example). Per batch, dL/dg_{l,h} = sum over tokens of <A_{l,h}, dL/dA_{l,h}>: the
    first-order Taylor estimate of the loss change when the head is removed.

    - `layer_l2`: divide each layer's row by its L2 norm (exponent 2, plus 1e-20 as in the
      reference, so an all-zero row stays zero).
    - `global_minmax`: then min-max normalise over all L*H heads (a constant tensor -> zeros).
    - `gather`: a data-parallel run (module docstring): the sums and token counts of every
      process's batches are added before dividing.

    Absent slots of a pruned model's layers are NaN (see the module docstring).

    Shape: -> `[L, H]` float32 on CPU.
    """
    counts = head_counts(loaded)
    total = torch.zeros(len(counts), max(counts), dtype=torch.float64)
    tokens = 0
    for step in _backward_passes(loaded, batches, per_token=False):
        assert step.gate_grad is not None
        total += step.gate_grad.detach().to("cpu", torch.float64).abs()
        tokens += int(step.mask.sum())
    total = _sum_over_processes(total, gather)
    tokens = int(_sum_over_processes(torch.tensor(tokens, dtype=torch.int64), gather))
    if tokens == 0:
        raise DataError(
            "no calibration tokens: the batches were empty",
            hint="pass a non-empty calibration set (--data, --calib-size)",
        )
    scores = total / tokens
    if layer_l2:
        # nan_to_num: a layer's absent (NaN) slots add nothing to its norm
        norm = scores.nan_to_num(0.0).pow(2).sum(dim=-1, keepdim=True).pow(0.5)
        scores = scores / (norm + 1e-20)
    if global_minmax:
        scores = minmax(scores, "global")
    return scores.float()


# --------------------------------------------------------------------------- HIES


def attention_entropy(probs: Tensor, mask: Tensor, causal: bool = False) -> Tensor:
    """Normalised attention entropy AE of every head, per example (HIES, §3.1).

    AE_h(x) = (1 / |Q|) * sum over query rows t in Q of H(alpha_t^(h)) / ln n_t, with
    H(p) = -sum_k p_k ln p_k over the keys query t can attend and n_t their number: the valid
    (non-pad) keys, and with `causal` only those at or before t. ln n_t is the largest
    entropy row t can have, so a uniform row scores 1 in a causal head as in a bidirectional
    one (dividing by ln of the whole row's length gave a uniform causal head 0.80 at n = 128).
    Q is the valid query rows with n_t >= 2 (a row with one key has no choice to measure: it
    is left out, not scored 0). Without `causal`, n_t = n for every row and this is the
    paper's (1 / (n ln n)) * sum_t H(alpha_t). Each row is renormalised over its attendable
    keys first, so probability mass that leaks onto padding or future keys (additive masks)
    does not count. The entropy is per query row, never of pooled attention. AE is in
    [0, 1]: 1 for uniform rows, 0 for one-hot rows; 0 when Q is empty (n <= 1).

    Shape: probs `[B, H, T, T]` (query, key), mask `[B, T]` of 0/1 -> `[B, H]`
    (float32, or float64 for float64 probs).
    """
    if probs.dim() != 4 or mask.dim() != 2:
        raise ValueError(
            f"expected probs [B, H, T, T] and mask [B, T]; got {tuple(probs.shape)} and "
            f"{tuple(mask.shape)}"
        )
    size, _, queries, keys = probs.shape
    if queries != keys or tuple(mask.shape) != (size, keys):
        raise ValueError(
            f"probs {tuple(probs.shape)} and mask {tuple(mask.shape)} do not describe the same "
            "batch of self-attention rows"
        )
    p = probs.to(torch.promote_types(probs.dtype, torch.float32))
    valid = mask.to(device=p.device, dtype=torch.bool)  # [B, T]
    allowed = valid[:, None, :].expand(size, queries, keys)  # [B, Tq, Tk]
    if causal:
        past = torch.ones(queries, keys, dtype=torch.bool, device=p.device).tril()
        allowed = allowed & past[None]
    p = torch.where(allowed[:, None], p, torch.zeros_like(p))
    tiny = torch.finfo(p.dtype).tiny
    p = p / p.sum(dim=-1, keepdim=True).clamp_min(tiny)
    row_entropy = -(p * torch.log(p.clamp_min(tiny))).sum(dim=-1)  # [B, H, T]
    n_t = allowed.sum(dim=-1).to(p.dtype)  # [B, T]: keys each query can attend
    scored = valid & (n_t >= 2)  # [B, T]: valid queries with a choice of keys
    log_n = torch.where(scored, torch.log(n_t.clamp_min(2.0)), torch.ones_like(n_t))
    normalised = (row_entropy / log_n[:, None, :]) * scored[:, None, :].to(p.dtype)
    count = scored.sum(dim=-1).to(p.dtype)  # [B]
    ae = normalised.sum(dim=-1) / count.clamp_min(1.0)[:, None]  # [B, H]
    return torch.where(count[:, None] > 0, ae, torch.zeros_like(ae))


def hies_scores(
    loaded: LoadedModel,
    batches: Iterable[Batch],
    *,
    alpha: float = 0.5,
    his_abs: str = "sample",
    norm_scope: str = "global",
    gather: Gather | None = None,
) -> dict[str, Tensor]:
    """Head Importance-Entropy Score (Choi et al. 2026), ALGORITHMS.md §3.2.

    Per batch (size B, mean loss L), per example b with n_b valid tokens, per head h:

        s_{b,h} = B * (1/n_b) * sum_{valid t} <dL/dA_{b,t,h}, A_{b,t,h}>

    where A is the concatenated head output entering the output projection. The mean loss
    gives dL/dA(x_b) = (1/B) dl_b/dA(x_b), so s_{b,h} is the token-averaged Taylor term of
    example b alone and does not depend on how examples are batched.

    - `his_abs="sample"` (the paper's definition, default): HIS_h = (1/N) sum_b |s_{b,h}|.
    - `his_abs="batch"` (the bertology-style reading): HIS_h = (1/N) sum_batches
      |sum_{b in batch} s_{b,h}|, i.e. each batch contributes B * |mean_b s_{b,h}| and the total
      is divided by the N examples (a ragged last batch weighs by its size). Equal to "sample"
      for batch size 1 and never larger (triangle inequality).
    - AE_h = (1/N) sum_b AE_h(x_b), see `attention_entropy` (causal for decoder families:
      each query normalised by ln of the keys it can attend).
    - Both are min-max normalised (`norm_scope` "global": over all L*H heads; "layer": within
      each layer; a constant group -> zeros), then HIES = alpha*HIS~ + (1-alpha)*(1-AE~), in
      [0, 1]. Low-entropy (focused) heads score higher.
    - `gather`: a data-parallel run (module docstring): HIS and AE sums and the example count
      of every process's batches are added before dividing and normalising.

    Returns {"score": HIES, "his": raw HIS, "ae": raw AE}.

    Shape: -> each `[L, H]` float32 on CPU.
    """
    if not (isinstance(alpha, int | float) and 0.0 <= float(alpha) <= 1.0):
        raise ConfigError(
            f"--alpha {alpha} is outside [0, 1]",
            hint="pass --alpha between 0 (entropy only) and 1 (importance only), e.g. 0.5",
        )
    _check_option("his_abs", his_abs, HIS_ABS, "--his-abs")
    _check_option("norm_scope", norm_scope, NORM_SCOPES, "--norm-scope")
    counts = head_counts(loaded)
    d_head = head_dim(loaded)
    # Absent slots (layers pruned to fewer heads) start as NaN and stay NaN.
    his = torch.zeros(len(counts), max(counts), dtype=torch.float64)
    his[absent_slots(counts)] = math.nan
    ae = his.clone()
    examples = 0
    causal = loaded.family.layout.causal  # AE: each query's attendable keys (decoders: <= t)
    with eager_attention(loaded):
        for step in _backward_passes(loaded, batches, per_token=True):
            assert step.head_inputs is not None and step.head_grads is not None
            assert step.attentions is not None
            mask = step.mask  # [B, T]
            size, tokens = mask.shape
            weight = mask.to(step.head_inputs[0].dtype)[:, :, None]  # [B, T, 1]
            n = mask.sum(dim=1).clamp_min(1)[:, None]  # [B, 1]; a fully padded row gives s = 0
            for layer, num_heads in enumerate(counts):
                attention = step.attentions[layer]
                if num_heads == 0 or attention is None:
                    continue
                # [B, T, H_l*d] -> [B, T, H_l, d]; the inner product over d gives [B, T, H_l]
                a = step.head_inputs[layer].view(size, tokens, num_heads, d_head)
                g = step.head_grads[layer].view(size, tokens, num_heads, d_head)
                inner = (g * a).sum(dim=-1) * weight
                s = size * inner.sum(dim=1) / n  # [B, H_l]
                s = s.to("cpu", torch.float64)
                if his_abs == "sample":
                    his[layer, :num_heads] += s.abs().sum(dim=0)
                else:
                    his[layer, :num_heads] += s.sum(dim=0).abs()
                ae[layer, :num_heads] += (
                    attention_entropy(attention, mask, causal).to("cpu", torch.float64).sum(dim=0)
                )
            examples += size
    his = _sum_over_processes(his, gather)
    ae = _sum_over_processes(ae, gather)
    examples = int(_sum_over_processes(torch.tensor(examples, dtype=torch.int64), gather))
    if examples == 0:
        raise DataError(
            "no calibration examples: the batches were empty",
            hint="pass a non-empty calibration set (--data, --calib-size)",
        )
    his /= examples
    ae /= examples
    score = alpha * minmax(his, norm_scope) + (1.0 - alpha) * (1.0 - minmax(ae, norm_scope))
    return {"score": score.float(), "his": his.float(), "ae": ae.float()}


# --------------------------------------------------------------------------- HeadMap


def example_losses(loaded: LoadedModel, batches: Iterable[Batch]) -> Tensor:
    """Per-example cross-entropy of the full (ungated) model, forward passes only, in eval mode.

    HeadMap calibrates on the examples the model already gets right with the lowest loss; this
    is the loss it ranks them by.

    Shape: -> `[N]` float64 on CPU (N = the examples of all batches, in order).
    """
    model = loaded.model
    device = _device(model)
    losses: list[Tensor] = []
    with torch.no_grad(), _eval_mode(model):
        for batch in batches:
            inputs, labels = _split(batch, device)
            logits = model(**inputs).logits.to(torch.float64)
            losses.append(F.cross_entropy(logits, labels, reduction="none").cpu())
    if not losses:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat(losses)


def lowest_loss(losses: Tensor, count: int) -> list[int]:
    """The indices of the `count` lowest losses, ties towards the lower index, sorted
    (HeadMap's `topk(-losses, k=limit)`, made deterministic).

    Shape: losses `[N]` -> min(count, N) indices.
    """
    order = sorted(range(losses.numel()), key=lambda i: (float(losses[i]), i))
    return sorted(order[: max(0, count)])


def headmap_evaluations(num_heads: int | list[int], num_layers: int | None = None) -> int:
    """Loss evaluations HeadMap's layer-conditioned search runs: one per head, i.e. sum H_l
    (L*H for an unpruned model). `num_heads`: the head count of every layer (then pass
    `num_layers`), or one count per layer."""
    if isinstance(num_heads, int):
        return num_heads * int(num_layers or 0)
    return sum(num_heads)


def headmap_scores(
    loaded: LoadedModel,
    batches: Iterable[Batch],
    keep_per_layer: list[int],
    *,
    ood_batches: Iterable[Batch] | None = None,
    progress: Progress | None = None,
) -> tuple[Tensor, list[list[int]]]:
    """HeadMap's layer-conditioned circuit locating (Wang et al., ICLR 2025; `locating.py`,
    `layer_conditioned_locating`), the search Hydra-Circ uses. Forward passes only.

    C starts empty. For layer l = 0..L-1, for every head h of layer l, the loss U is evaluated
    with the heads C + {(l, h)} masked (gate 0) and every other head open. The `keep_per_layer[l]`
    heads with the highest U (masking them hurts most; ties -> lower head index) join C and
    stay masked while later layers are searched. C is the circuit: the heads kept. Cost: one
    evaluation per head, sum H_l (`headmap_evaluations`).

    U (higher = worse): the mean cross-entropy over `batches` (HeadMap's loss; the caller
    picks the batches, HeadMap uses the lowest-loss examples, see `lowest_loss`). With
    `ood_batches`: NLL_in / ln C - AUROC(predictive entropy in vs OOD), the negated
    objective of `circuit_scores` (Hydra-Circ's "uncertainty validation set" loss is not
    published; this one is ours).

    Score: U itself, HeadMap's `scores` table: per layer the loss with that head masked on top
    of C. Scores rank heads within a layer only (each layer is measured with a different C).
    Absent slots of a pruned model's shorter layers are NaN.

    Returns (score, kept): kept[l] is the sorted list of heads kept in layer l.

    Shape: -> score `[L, H]` float32 on CPU.
    """
    counts = head_counts(loaded)
    keep = _check_keep(keep_per_layer, counts)
    model = loaded.model
    cached_in, cached_ood = _cache_batches(model, batches, ood_batches)
    total = headmap_evaluations(counts)
    done = 0
    score = torch.zeros(len(counts), max(counts), dtype=torch.float32)
    score[absent_slots(counts)] = math.nan
    kept: list[list[int]] = []
    # gate values of the search state: 0 for the heads in C, 1 elsewhere
    state = [torch.ones(heads) for heads in counts]
    with torch.no_grad(), _eval_mode(model), HeadGates(loaded) as gates:
        for layer, num_heads in enumerate(counts):
            losses: dict[int, float] = {}
            for head in range(num_heads):
                state[layer][head] = 0.0
                gates.set(state)
                value = -_objective(model, cached_in, cached_ood)
                state[layer][head] = 1.0
                # NaN compares false with everything: rank it as the least harmful instead.
                losses[head] = value if not math.isnan(value) else -math.inf
                score[layer, head] = float(value)
                done += 1
                if progress is not None:
                    progress(done, total)
            ranked = sorted(range(num_heads), key=lambda h: (-losses[h], h))
            chosen = sorted(ranked[: keep[layer]])
            # Later layers are searched with this layer's circuit heads masked.
            for head in chosen:
                state[layer][head] = 0.0
            kept.append(chosen)
    return score, kept


def _cache_batches(
    model: nn.Module,
    batches: Iterable[Batch],
    ood_batches: Iterable[Batch] | None,
    gather: Gather | None = None,
) -> tuple[list[tuple[dict[str, Any], Tensor]], list[dict[str, Any]] | None]:
    """Every batch moved to the model's device once, to be reused by every evaluation. In a
    data-parallel run (`gather`) a process may hold no batch; the set is empty only when
    every process's is."""
    device = _device(model)
    cached_in = [_split(batch, device) for batch in batches]
    examples = torch.tensor(sum(labels.shape[0] for _, labels in cached_in), dtype=torch.int64)
    if int(_sum_over_processes(examples, gather)) == 0:
        raise DataError(
            "no calibration examples: the batches were empty",
            hint="pass a non-empty calibration set (--data, --calib-size)",
        )
    cached_ood: list[dict[str, Any]] | None = None
    if ood_batches is not None:
        cached_ood = [_split(batch, device, need_labels=False)[0] for batch in ood_batches]
        ood_count = torch.tensor(len(cached_ood), dtype=torch.int64)
        if int(_sum_over_processes(ood_count, gather)) == 0:
            raise DataError(
                "the OOD set has no batches",
                hint="pass a non-empty OOD set (--ood), or leave it out for the NLL objective",
            )
    return cached_in, cached_ood


# --------------------------------------------------------------------------- greedy circuit search


def circuit_evaluations(keep_per_layer: list[int], num_heads: int | list[int]) -> int:
    """Objective evaluations the greedy search runs: at each pick, one per remaining
    candidate, except a pick with a single candidate left (nothing to compare).
    `num_heads`: the head count of every layer, or one count per layer."""
    counts = [num_heads] * len(keep_per_layer) if isinstance(num_heads, int) else num_heads
    return sum(
        heads - step
        for keep, heads in zip(keep_per_layer, counts, strict=True)
        for step in range(keep)
        if heads - step > 1
    )


def _predictive_entropy(logits: Tensor) -> Tensor:
    """The predictive entropy (uq/functional's one definition) of one model's logits.

    Shape: `[B, C]` float64 -> `[B]` (nats).
    """
    return entropy(torch.softmax(logits, dim=-1))


def _objective(
    model: nn.Module,
    cached_in: list[tuple[dict[str, Any], Tensor]],
    cached_ood: list[dict[str, Any]] | None,
    gather: Gather | None = None,
) -> float:
    """The circuit objective of the currently gated model (higher is better).

    Without OOD data: -NLL_in, the mean cross-entropy over all in-distribution examples.
    With OOD data: AUROC(entropy_in, entropy_ood) - NLL_in / ln C, where entropy is the
    predictive entropy of softmax(logits) (OOD positive, higher = more OOD) and C the number of
    classes. ln C is the NLL of a uniform prediction, so both terms live on a ~[0, 1] scale: a
    circuit is rewarded for separating OOD data and penalised for losing accuracy/calibration.
    With `gather`, the loss sums, counts and entropies of every process's batches (a process
    may have none) are combined first, so every process gets the same value.
    """
    nll_sum = torch.zeros((), dtype=torch.float64)
    count = 0
    entropy_in: list[Tensor] = []
    classes = 0  # none seen (a process without batches); ln C uses at least 2
    for inputs, labels in cached_in:
        logits = model(**inputs).logits.to(torch.float64)
        classes = logits.shape[-1]
        nll_sum += F.cross_entropy(logits, labels, reduction="sum").cpu()
        count += labels.shape[0]
        if cached_ood is not None:
            entropy_in.append(_predictive_entropy(logits).cpu())
    if gather is not None:
        # [nll sum, examples, classes] per process -> [P, 3]: summed, summed, max
        packed = gather(
            torch.stack([nll_sum, torch.tensor(count + 0.0), torch.tensor(classes + 0.0)]).to(
                torch.float64
            )[None]
        )
        nll_sum = packed[:, 0].sum()
        count = int(packed[:, 1].sum())
        classes = int(packed[:, 2].max())
    nll = float(nll_sum) / count
    if cached_ood is None:
        return -nll
    entropy_ood = [
        _predictive_entropy(model(**inputs).logits.to(torch.float64)).cpu() for inputs in cached_ood
    ]
    scores_in = torch.cat(entropy_in) if entropy_in else torch.empty(0, dtype=torch.float64)
    scores_ood = torch.cat(entropy_ood) if entropy_ood else torch.empty(0, dtype=torch.float64)
    if gather is not None:
        scores_in, scores_ood = gather(scores_in), gather(scores_ood)
    separation = auroc(scores_in, scores_ood)
    return separation - nll / math.log(max(classes, 2))


def circuit_scores(
    loaded: LoadedModel,
    batches: Iterable[Batch],
    keep_per_layer: list[int],
    *,
    ood_batches: Iterable[Batch] | None = None,
    progress: Progress | None = None,
    gather: Gather | None = None,
) -> tuple[Tensor, list[list[int]]]:
    """uqc's greedy forward circuit search (`--method greedy-circuit`), forward passes only.

    NOT HeadMap's algorithm (that is `headmap_scores`): this search grows a circuit one head at
    a time with only the chosen heads open in earlier layers, and has its own objective.
    Layers are visited in order 0..L-1. Earlier layers are restricted to their chosen heads
    (others gated to 0), later layers are fully open. In layer l, heads are picked one at a
    time: for every head not yet kept, the objective is evaluated with this layer's gates =
    chosen + {candidate}, and the best candidate is kept (ties -> lower head index), until
    `keep_per_layer[l]` heads are kept.

    Objective (higher is better): -mean NLL on `batches`; with `ood_batches`,
    AUROC(predictive entropy in vs OOD, OOD positive) - NLL_in / ln C (see `_objective`).

    Score, per layer a permutation of 1..H_l (the layer's current head count): the head picked
    i-th (0-based) scores H_l - i; the heads never picked score H_l - k, ..., 1, ordered by
    their objective at the layer's last pick (ties -> lower index). Scores rank heads within a
    layer only. Absent slots of a pruned model's shorter layers are NaN.

    Each batch is moved to the device once and reused by every evaluation. `progress(done,
    total)` is called after each evaluation, total = `circuit_evaluations(keep_per_layer,
    heads_per_layer)`.

    `gather`: a data-parallel run (module docstring): every evaluation combines the losses
    and entropies of every process's batches, so every process takes the same picks.

    Returns (score, kept): kept[l] is the sorted list of heads kept in layer l.

    Shape: -> score `[L, H]` float32 on CPU.
    """
    counts = head_counts(loaded)
    keep = _check_keep(keep_per_layer, counts)
    model = loaded.model
    cached_in, cached_ood = _cache_batches(model, batches, ood_batches, gather)
    total = circuit_evaluations(keep, counts)
    done = 0
    score = torch.zeros(len(counts), max(counts), dtype=torch.float32)
    score[absent_slots(counts)] = math.nan
    kept: list[list[int]] = []
    # the gate values of the current search state, one [H_l] vector per layer
    open_gates = [torch.ones(heads) for heads in counts]
    with torch.no_grad(), _eval_mode(model), HeadGates(loaded) as gates:
        for layer, num_heads in enumerate(counts):
            chosen: list[int] = []
            last: dict[int, float] = {}
            for _ in range(keep[layer]):
                candidates = [h for h in range(num_heads) if h not in chosen]
                if len(candidates) == 1:
                    chosen.append(candidates[0])
                    continue
                values: dict[int, float] = {}
                for head in candidates:
                    open_gates[layer].zero_()
                    open_gates[layer][[*chosen, head]] = 1.0
                    gates.set(open_gates)
                    value = _objective(model, cached_in, cached_ood, gather)
                    # NaN compares false with everything: rank it last instead.
                    values[head] = value if not math.isnan(value) else -math.inf
                    done += 1
                    if progress is not None:
                        progress(done, total)
                chosen.append(max(candidates, key=lambda h: (values[h], -h)))
                last = values
            for order, head in enumerate(chosen):
                score[layer, head] = float(num_heads - order)
            rest = sorted(
                (h for h in range(num_heads) if h not in chosen),
                key=lambda h: (-last.get(h, -math.inf), h),
            )
            for order, head in enumerate(rest):
                score[layer, head] = float(num_heads - len(chosen) - order)
            # Later layers are searched with this layer restricted to its circuit.
            open_gates[layer].zero_()
            open_gates[layer][chosen] = 1.0
            kept.append(sorted(chosen))
    return score, kept


def _check_keep(keep_per_layer: list[int], counts: list[int]) -> list[int]:
    """Each layer keeps 1..H_l heads (0 only in a layer that has none left)."""
    keep = list(keep_per_layer)
    if len(keep) != len(counts):
        raise ConfigError(
            f"keep_per_layer has {len(keep)} entries; the model has {len(counts)} layers",
            hint="give one kept-head count per layer",
        )
    for layer, (k, heads) in enumerate(zip(keep, counts, strict=True)):
        if isinstance(k, bool) or not isinstance(k, int) or not min(1, heads) <= k <= heads:
            raise ConfigError(
                f"layer {layer} would keep {k!r} heads; it has {heads} and keeps "
                f"{min(1, heads)}..{heads}",
                hint="lower --ratio so every layer keeps at least one head",
            )
    return keep


# --------------------------------------------------------------------------- baselines


def random_scores(num_layers: int, num_heads: int, seed: int) -> Tensor:
    """Uniform random scores in [0, 1) from a seeded generator (the same seed, the same
    scores, on every machine: drawn on CPU).

    Shape: -> `[L, H]` float32 on CPU.
    """
    for name, value in (("layers", num_layers), ("heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"random scores need a positive number of {name}; got {value!r}",
                hint="score a model with at least one attention head per layer",
            )
    generator = torch.Generator().manual_seed(int(seed))
    return torch.rand(num_layers, num_heads, generator=generator, dtype=torch.float32)


def random_head_scores(loaded: LoadedModel, seed: int) -> Tensor:
    """`random_scores` for the heads this model has now: `[L, max H_l]`, NaN in the absent
    slots of a pruned model's shorter layers (an unpruned model gets exactly
    `random_scores(L, H, seed)`).

    Shape: -> `[L, H]` float32 on CPU.
    """
    counts = head_counts(loaded)
    scores = random_scores(len(counts), max(counts), seed)
    scores[absent_slots(counts)] = math.nan
    return scores


def l2_scores(loaded: LoadedModel) -> Tensor:
    """Per head, the L2 (Frobenius) norm of its d_h input columns of the output projection:
    how large a contribution the head can write into the residual stream.

    Shape: -> `[L, H]` float32 on CPU (NaN in the absent slots of a pruned model's shorter
    layers).
    """
    counts = head_counts(loaded)
    d_head = head_dim(loaded)
    rows = []
    layers = loaded.family.attention_layers(loaded.model)
    for parts, num_heads in zip(layers, counts, strict=True):
        weight = parts.output.weight.detach().to("cpu", torch.float32)  # [out, H_l*d]
        per_head = weight.view(weight.shape[0], num_heads, d_head)  # [out, H_l, d]
        rows.append(per_head.pow(2).sum(dim=(0, 2)).sqrt())  # [H_l]
    return pad_rows(rows, counts)
