"""`--method taylor`: Michel et al. (2019) head importance, |dL/dg| at head gates g = 1.

torch is imported inside the functions: the registry (and with it `uqc --help`) imports this
module for its `SCORER`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from uqcompress.methods.scoring.scorer import Batch, Gather, Scorer, ScoreRequest, ScoreResult

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.models.loading import LoadedModel


def gate_gradient(loaded: LoadedModel, batch: Batch) -> Tensor:
    """Signed gradient dL/dg of the mean batch loss w.r.t. every head gate, at g = 1.

    This is the quantity whose absolute value `taylor_scores` accumulates; exposed so that it
    can be checked against finite differences.

    Shape: -> `[L, H]` float32 on CPU.
    """
    from uqcompress.methods.scoring.common import backward_passes

    (result,) = list(backward_passes(loaded, [batch], per_token=False))
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
    - `gather`: a data-parallel run (`common`): the sums and token counts of every
      process's batches are added before dividing.

    Absent slots of a pruned model's layers are NaN (see `common`).

    Shape: -> `[L, H]` float32 on CPU.
    """
    import torch

    from uqcompress.errors import DataError
    from uqcompress.methods.scoring.common import (
        backward_passes,
        head_counts,
        minmax,
        sum_over_processes,
    )

    counts = head_counts(loaded)
    total = torch.zeros(len(counts), max(counts), dtype=torch.float64)
    tokens = 0
    for step in backward_passes(loaded, batches, per_token=False):
        assert step.gate_grad is not None
        total += step.gate_grad.detach().to("cpu", torch.float64).abs()
        tokens += int(step.mask.sum())
    total = sum_over_processes(total, gather)
    tokens = int(sum_over_processes(torch.tensor(tokens, dtype=torch.int64), gather))
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


def _score(request: ScoreRequest) -> ScoreResult:
    from uqcompress.methods.scoring.common import counted

    batches = request.calibration()
    with request.progress("taylor: backward passes") as report:
        score = taylor_scores(
            request.loaded,
            counted(batches, report),
            layer_l2=request.options["taylor_layer_l2"],
            global_minmax=request.options["taylor_minmax"],
            gather=request.gather,
        )
    return ScoreResult({"score": score}, {})


SCORER = Scorer(name="taylor", score=_score, needs_data=True)
