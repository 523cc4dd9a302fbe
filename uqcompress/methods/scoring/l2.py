"""`--method l2`: the norm of each head's slice of the attention output projection, a data-free
baseline.

torch is imported inside the function: the registry (and with it `uqc --help`) imports this
module for its `SCORER`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from uqcompress.methods.scoring.scorer import Scorer, ScoreRequest, ScoreResult

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.models.loading import LoadedModel


def l2_scores(loaded: LoadedModel) -> Tensor:
    """Per head, the L2 (Frobenius) norm of its d_h input columns of the output projection:
    how large a contribution the head can write into the residual stream.

    Shape: -> `[L, H]` float32 on CPU (NaN in the absent slots of a pruned model's shorter
    layers).
    """
    import torch

    from uqcompress.methods.scoring.common import head_counts, pad_rows
    from uqcompress.models.head_gates import head_dim

    counts = head_counts(loaded)
    d_head = head_dim(loaded)
    rows = []
    layers = loaded.family.attention_layers(loaded.model)
    for parts, num_heads in zip(layers, counts, strict=True):
        weight = parts.output.weight.detach().to("cpu", torch.float32)  # [out, H_l*d]
        per_head = weight.view(weight.shape[0], num_heads, d_head)  # [out, H_l, d]
        rows.append(per_head.pow(2).sum(dim=(0, 2)).sqrt())  # [H_l]
    return pad_rows(rows, counts)


def _score(request: ScoreRequest) -> ScoreResult:
    return ScoreResult({"score": l2_scores(request.loaded)}, {})


SCORER = Scorer(name="l2", score=_score)
