"""`--method random`: seeded uniform scores, the baseline every other scorer should beat.

(Named so as not to shadow the standard library's `random`.) torch is imported inside the
functions: the registry (and with it `uqc --help`) imports this module for its `SCORER`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from uqcompress.methods.scoring.scorer import Scorer, ScoreRequest, ScoreResult

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.models.loading import LoadedModel


def random_scores(num_layers: int, num_heads: int, seed: int) -> Tensor:
    """Uniform random scores in [0, 1) from a seeded generator (the same seed, the same
    scores, on every machine: drawn on CPU).

    Shape: -> `[L, H]` float32 on CPU.
    """
    import torch

    from uqcompress.errors import ConfigError

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
    from uqcompress.methods.scoring.common import absent_slots, head_counts

    counts = head_counts(loaded)
    scores = random_scores(len(counts), max(counts), seed)
    scores[absent_slots(counts)] = math.nan
    return scores


def _score(request: ScoreRequest) -> ScoreResult:
    return ScoreResult({"score": random_head_scores(request.loaded, request.options["seed"])}, {})


SCORER = Scorer(name="random", score=_score)
