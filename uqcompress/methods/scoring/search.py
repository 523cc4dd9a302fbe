"""What the two circuit searches (`headmap`, `greedy-circuit`) share: batches cached on the
device, the objective of the currently gated model, the kept-head budget, and the summary a
searched scorer writes.

Forward passes only; conventions as in `common` (gather: a data-parallel run).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from uqcompress.errors import ConfigError, DataError
from uqcompress.methods.pruning import heads_to_remove
from uqcompress.methods.scoring.common import (
    model_device,
    split_batch,
    sum_over_processes,
)
from uqcompress.methods.scoring.scorer import Batch, Gather, ScoreRequest, ScoreResult
from uqcompress.uq.functional import auroc, entropy


def cache_batches(
    model: nn.Module,
    batches: Iterable[Batch],
    ood_batches: Iterable[Batch] | None,
    gather: Gather | None = None,
) -> tuple[list[tuple[dict[str, Any], Tensor]], list[dict[str, Any]] | None]:
    """Every batch moved to the model's device once, to be reused by every evaluation. In a
    data-parallel run (`gather`) a process may hold no batch; the set is empty only when
    every process's is."""
    device = model_device(model)
    cached_in = [split_batch(batch, device) for batch in batches]
    examples = torch.tensor(sum(labels.shape[0] for _, labels in cached_in), dtype=torch.int64)
    if int(sum_over_processes(examples, gather)) == 0:
        raise DataError(
            "no calibration examples: the batches were empty",
            hint="pass a non-empty calibration set (--data, --calib-size)",
        )
    cached_ood: list[dict[str, Any]] | None = None
    if ood_batches is not None:
        cached_ood = [split_batch(batch, device, need_labels=False)[0] for batch in ood_batches]
        ood_count = torch.tensor(len(cached_ood), dtype=torch.int64)
        if int(sum_over_processes(ood_count, gather)) == 0:
            raise DataError(
                "the OOD set has no batches",
                hint="pass a non-empty OOD set (--ood), or leave it out for the NLL objective",
            )
    return cached_in, cached_ood


def predictive_entropy(logits: Tensor) -> Tensor:
    """The predictive entropy (uq/functional's one definition) of one model's logits.

    Shape: `[B, C]` float64 -> `[B]` (nats).
    """
    return entropy(torch.softmax(logits, dim=-1))


def objective(
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
            entropy_in.append(predictive_entropy(logits).cpu())
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
        predictive_entropy(model(**inputs).logits.to(torch.float64)).cpu() for inputs in cached_ood
    ]
    scores_in = torch.cat(entropy_in) if entropy_in else torch.empty(0, dtype=torch.float64)
    scores_ood = torch.cat(entropy_ood) if entropy_ood else torch.empty(0, dtype=torch.float64)
    if gather is not None:
        scores_in, scores_ood = gather(scores_in), gather(scores_ood)
    separation = auroc(scores_in, scores_ood)
    return separation - nll / math.log(max(classes, 2))


def check_keep(keep_per_layer: list[int], counts: list[int]) -> list[int]:
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


def keep_for_ratio(counts: list[int], ratio: float) -> list[int]:
    """Heads each layer keeps when `ratio` of them is removed, per layer, of the heads the
    model has now (not config.num_attention_heads): the budget a search fills."""
    return [h - heads_to_remove(ratio, 1, h, "layer") for h in counts]


def searched_result(
    score: Tensor,
    kept: list[list[int]],
    keep: list[int],
    request: ScoreRequest,
    evaluations: int,
    calibration: dict[str, Any] | None = None,
) -> ScoreResult:
    """A search's scores and the summary prune and the user read: the budget, the heads
    kept, the objective (`ood` with --ood, else `nll`), and how many evaluations ran."""
    return ScoreResult(
        {"score": score},
        {
            "ratio": request.options["ratio"],
            "keep_per_layer": keep,
            "kept_heads": kept,
            "objective": "ood" if request.ood is not None else "nll",
            "evaluations": evaluations,
            **(calibration or {}),
        },
    )
