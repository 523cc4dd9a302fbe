"""`--method hies`: the Head Importance-Entropy Score (Choi et al. 2026), docs/methods/pruning.md:
per-example Taylor importance (HIS) against normalised attention entropy (AE).

torch is imported inside the functions: the registry (and with it `uqc --help`) imports this
module for its `SCORER`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from uqcompress.methods.scoring.scorer import Batch, Gather, Scorer, ScoreRequest, ScoreResult

if TYPE_CHECKING:
    from torch import Tensor

    from uqcompress.models.loading import LoadedModel

HIS_ABS = ("sample", "batch")


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
    import torch

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
    """Head Importance-Entropy Score (Choi et al. 2026), docs/methods/pruning.md.

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
    - `gather`: a data-parallel run (`common`): HIS and AE sums and the example count
      of every process's batches are added before dividing and normalising.

    Returns {"score": HIES, "his": raw HIS, "ae": raw AE}.

    Shape: -> each `[L, H]` float32 on CPU.
    """
    import torch

    from uqcompress.errors import ConfigError, DataError
    from uqcompress.methods.scoring.common import (
        NORM_SCOPES,
        absent_slots,
        backward_passes,
        check_option,
        head_counts,
        minmax,
        sum_over_processes,
    )
    from uqcompress.models import head_gates

    if not (isinstance(alpha, int | float) and 0.0 <= float(alpha) <= 1.0):
        raise ConfigError(
            f"--alpha {alpha} is outside [0, 1]",
            hint="pass --alpha between 0 (entropy only) and 1 (importance only), e.g. 0.5",
        )
    check_option("his_abs", his_abs, HIS_ABS, "--his-abs")
    check_option("norm_scope", norm_scope, NORM_SCOPES, "--norm-scope")
    counts = head_counts(loaded)
    d_head = head_gates.head_dim(loaded)
    # Absent slots (layers pruned to fewer heads) start as NaN and stay NaN.
    his = torch.zeros(len(counts), max(counts), dtype=torch.float64)
    his[absent_slots(counts)] = math.nan
    ae = his.clone()
    examples = 0
    causal = loaded.family.layout.causal  # AE: each query's attendable keys (decoders: <= t)
    # looked up on head_gates when called (a test stands in for it there)
    with head_gates.eager_attention(loaded):
        for step in backward_passes(loaded, batches, per_token=True):
            assert step.head_inputs is not None and step.head_grads is not None
            assert step.attentions is not None
            mask = step.mask  # [B, T]
            size, tokens = mask.shape
            # float32 products and sums whatever the model computes in (--dtype bfloat16:
            # an 8-bit mantissa would round the inner products the ranking rests on)
            weight = mask.to(torch.float32)[:, :, None]  # [B, T, 1]
            n = mask.sum(dim=1).clamp_min(1)[:, None]  # [B, 1]; a fully padded row gives s = 0
            for layer, num_heads in enumerate(counts):
                attention = step.attentions[layer]
                if num_heads == 0 or attention is None:
                    continue
                # [B, T, H_l*d] -> [B, T, H_l, d]; the inner product over d gives [B, T, H_l]
                a = step.head_inputs[layer].view(size, tokens, num_heads, d_head).float()
                g = step.head_grads[layer].view(size, tokens, num_heads, d_head).float()
                inner = (g * a).sum(dim=-1) * weight
                s = size * inner.sum(dim=1) / n  # [B, H_l]
                s = s.to("cpu", torch.float64)
                if his_abs == "sample":
                    his[layer, :num_heads] += s.abs().sum(dim=0)
                else:
                    his[layer, :num_heads] += s.sum(dim=0).abs()
                ae[layer, :num_heads] += (
                    attention_entropy(attention.float(), mask, causal)
                    .to("cpu", torch.float64)
                    .sum(dim=0)
                )
            examples += size
    his = sum_over_processes(his, gather)
    ae = sum_over_processes(ae, gather)
    examples = int(sum_over_processes(torch.tensor(examples, dtype=torch.int64), gather))
    if examples == 0:
        raise DataError(
            "no calibration examples: the batches were empty",
            hint="pass a non-empty calibration set (--data, --calib-size)",
        )
    his /= examples
    ae /= examples
    score = alpha * minmax(his, norm_scope) + (1.0 - alpha) * (1.0 - minmax(ae, norm_scope))
    return {"score": score.float(), "his": his.float(), "ae": ae.float()}


def _score(request: ScoreRequest) -> ScoreResult:
    from uqcompress.methods.scoring.common import counted

    batches = request.calibration()
    options = request.options
    with request.progress("hies: backward passes") as report:
        parts = hies_scores(
            request.loaded,
            counted(batches, report),
            alpha=options["alpha"],
            his_abs=options["his_abs"],
            norm_scope=options["norm_scope"],
            gather=request.gather,
        )
    return ScoreResult({"score": parts["score"], "his": parts["his"], "ae": parts["ae"]}, {})


SCORER = Scorer(
    name="hies",
    score=_score,
    needs_data=True,
    # AE divides each query by ln of the keys it can attend (issue 26): a scores artifact of
    # the earlier definition is not reused for it
    id_config={"ae_normaliser": "attendable-keys"},
)
