"""`--method greedy-circuit` (old name `circuit`): uqc's own greedy forward circuit search, one
head at a time, with an NLL or OOD-separation objective. Not HeadMap's algorithm (`headmap`).

torch is imported inside the functions: the registry (and with it `uqc --help`) imports this
module for its `SCORER`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from uqcompress.methods.scoring.scorer import (
    Batch,
    Gather,
    Progress,
    Scorer,
    ScoreRequest,
    ScoreResult,
)

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.models.loading import LoadedModel


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
    AUROC(predictive entropy in vs OOD, OOD positive) - NLL_in / ln C (see `search.objective`).

    Score, per layer a permutation of 1..H_l (the layer's current head count): the head picked
    i-th (0-based) scores H_l - i; the heads never picked score H_l - k, ..., 1, ordered by
    their objective at the layer's last pick (ties -> lower index). Scores rank heads within a
    layer only. Absent slots of a pruned model's shorter layers are NaN.

    Each batch is moved to the device once and reused by every evaluation. `progress(done,
    total)` is called after each evaluation, total = `circuit_evaluations(keep_per_layer,
    heads_per_layer)`.

    `gather`: a data-parallel run (`common`): every evaluation combines the losses
    and entropies of every process's batches, so every process takes the same picks.

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
    cached_in, cached_ood = cache_batches(model, batches, ood_batches, gather)
    total = circuit_evaluations(keep, counts)
    done = 0
    score = torch.zeros(len(counts), max(counts), dtype=torch.float32)
    score[absent_slots(counts)] = math.nan
    kept: list[list[int]] = []
    # the gate values of the current search state, one [H_l] vector per layer
    open_gates = [torch.ones(heads) for heads in counts]
    with torch.no_grad(), eval_mode(model), HeadGates(loaded) as gates:
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
                    value = objective(model, cached_in, cached_ood, gather)
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


def _score(request: ScoreRequest) -> ScoreResult:
    from uqcompress.methods.scoring.common import head_counts
    from uqcompress.methods.scoring.search import keep_for_ratio, searched_result

    batches = request.calibration()
    heads = head_counts(request.loaded)
    keep = keep_for_ratio(heads, request.options["ratio"])
    ood = request.ood() if request.ood is not None else None
    with request.progress("greedy-circuit search") as report:
        score, kept = circuit_scores(
            request.loaded, batches, keep, ood_batches=ood, progress=report, gather=request.gather
        )
    return searched_result(score, kept, keep, request, circuit_evaluations(keep, heads))


SCORER = Scorer(
    name="greedy-circuit",
    score=_score,
    about="uqc's own greedy forward search; 'circuit' is its old name",
    needs_data=True,
    searched=True,
    # `circuit` was uqc's greedy search, documented as HeadMap's until HeadMap's own
    # algorithm arrived as `headmap`; scores artifacts written before the rename say it.
    aliases=("circuit",),
    alias_note="uqc's greedy search, not HeadMap's: that is --method headmap",
)
