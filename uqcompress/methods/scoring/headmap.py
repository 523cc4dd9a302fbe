"""`--method headmap`: HeadMap's layer-conditioned circuit locating (Wang et al., ICLR 2025),
the search Hydra-Circ uses, on the lowest-loss calibration examples.

torch is imported inside the functions: the registry (and with it `uqc --help`) imports this
module for its `SCORER`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from uqcompress.methods.scoring.scorer import Batch, Progress, Scorer, ScoreRequest, ScoreResult

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.errors import Problems
    from uqcompress.models.loading import LoadedModel


def example_losses(loaded: LoadedModel, batches: Iterable[Batch]) -> Tensor:
    """Per-example cross-entropy of the full (ungated) model, forward passes only, in eval mode.

    HeadMap calibrates on the examples the model already gets right with the lowest loss; this
    is the loss it ranks them by.

    Shape: -> `[N]` float64 on CPU (N = the examples of all batches, in order).
    """
    import torch
    import torch.nn.functional as F

    from uqcompress.methods.scoring.common import eval_mode, model_device, split_batch

    model = loaded.model
    device = model_device(model)
    losses: list[Tensor] = []
    with torch.no_grad(), eval_mode(model):
        for batch in batches:
            inputs, labels = split_batch(batch, device)
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
    objective of `circuit_scores` (`search.objective`; Hydra-Circ's "uncertainty validation
    set" loss is not published; this one is ours).

    Score: U itself, HeadMap's `scores` table: per layer the loss with that head masked on top
    of C. Scores rank heads within a layer only (each layer is measured with a different C).
    Absent slots of a pruned model's shorter layers are NaN.

    Returns (score, kept): kept[l] is the sorted list of heads kept in layer l.

    Shape: -> score `[L, H]` float32 on CPU.
    """
    import torch

    from uqcompress.methods.scoring.common import absent_slots, eval_mode, head_counts
    from uqcompress.methods.scoring.search import cache_batches, check_keep, objective
    from uqcompress.models.head_gates import HeadGates

    counts = head_counts(loaded)
    keep = check_keep(keep_per_layer, counts)
    model = loaded.model
    cached_in, cached_ood = cache_batches(model, batches, ood_batches)
    total = headmap_evaluations(counts)
    done = 0
    score = torch.zeros(len(counts), max(counts), dtype=torch.float32)
    score[absent_slots(counts)] = math.nan
    kept: list[list[int]] = []
    # gate values of the search state: 0 for the heads in C, 1 elsewhere
    state = [torch.ones(heads) for heads in counts]
    with torch.no_grad(), eval_mode(model), HeadGates(loaded) as gates:
        for layer, num_heads in enumerate(counts):
            losses: dict[int, float] = {}
            for head in range(num_heads):
                state[layer][head] = 0.0
                gates.set(state)
                value = -objective(model, cached_in, cached_ood)
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


def _lowest_loss_batches(request: ScoreRequest) -> tuple[Sequence[Batch], dict[str, Any]]:
    """HeadMap's calibration set: of a pool (all of --data, or a seeded `calib_pool` subset),
    the `calib_size` examples with the lowest loss under the full model."""
    import numpy as np

    options, examples = request.options, request.examples
    pool_size = examples if options["calib_pool"] is None else min(options["calib_pool"], examples)
    if pool_size == examples:
        pool = np.arange(pool_size)
    else:
        rng = np.random.default_rng(options["seed"])
        pool = np.sort(rng.choice(examples, pool_size, replace=False))
    # HeadMap is not data-parallel: every process picks from the whole pool (same result)
    losses = example_losses(request.loaded, request.encode(pool, False))
    chosen = lowest_loss(losses, options["calib_size"])
    picked = losses[chosen]
    info = {
        "calibration_set": "lowest-loss",
        "calibration_pool": int(pool_size),
        "calibration_loss_max": round(float(picked.max()), 6),
        "pool_loss_mean": round(float(losses.mean()), 6),
    }
    return request.encode(pool[chosen], False), info


def _score(request: ScoreRequest) -> ScoreResult:
    from uqcompress.methods.scoring.common import head_counts
    from uqcompress.methods.scoring.search import keep_for_ratio, searched_result

    batches, calibration = _lowest_loss_batches(request)
    heads = head_counts(request.loaded)
    keep = keep_for_ratio(heads, request.options["ratio"])
    ood = request.ood() if request.ood is not None else None
    with request.progress("headmap search") as report:
        # every process searches all its batches (not sharded)
        score, kept = headmap_scores(
            request.loaded, batches, keep, ood_batches=ood, progress=report
        )
    return searched_result(score, kept, keep, request, headmap_evaluations(heads), calibration)


def _check(options: Mapping[str, Any], problems: Problems) -> None:
    pool, size, members = options["calib_pool"], options["calib_size"], options["members"]
    if pool is not None:
        if pool < size:
            problems.add(
                f"--calib-pool {pool} is smaller than --calib-size {size}",
                hint=f"pass --calib-pool {4 * size} or more",
            )
    elif members > 1:
        problems.add(
            f"--method headmap --members {members} would search the same lowest-loss "
            "examples for every member (identical circuits)",
            hint="pass --calib-pool N: member m then draws its own N-example pool (seed + m)",
        )


SCORER = Scorer(
    name="headmap",
    score=_score,
    about="HeadMap's layer-conditioned circuit locating, as Hydra-Circ uses it",
    needs_data=True,
    searched=True,
    own_options={"calib_pool": "it keeps the pool's lowest-loss examples"},
    check=_check,
)
