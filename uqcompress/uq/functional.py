"""Torch functions turning ensemble (multi-member) logits into predictive uncertainty.

Conventions: ``B`` is the batch size, ``M`` the number of ensemble members (or
stochastic forward passes) and ``C`` the number of classes. All logarithms are
natural, so entropies and mutual information are in nats.

Everything here is built from ops that export cleanly to ONNX (Softmax, Log, Mul,
ReduceSum, ReduceMean, Clip, Sub, Cast); no Einsum, no xlogy.

The one definition of the uncertainty outputs (every graph's, the Predictor's, `eval`'s,
`predict`'s and `calibrate`'s), with ``p_m = softmax(member_logits[:, m])``:

- ``probs = p_bar = (1/M) sum_m p_m``;
- ``entropy = H(p_bar) = -sum_c p_bar_c * ln(max(p_bar_c, tiny))`` (so ``0 ln 0 = 0``);
- ``mutual_info = (1/M) sum_m sum_c p_mc * (ln max(p_mc, tiny) - ln max(p_bar_c, tiny))``,
  clamped at 0: the mean KL of each member from the mixture, which equals
  ``H(p_bar) - mean_m H(p_m)`` but has no cancellation between two large entropies, and is
  exactly 0 for M = 1.

``tiny`` is the smallest normal number of the dtype. The exported graph and every consumer
that applies a threshold to these values (`calibrate` fits the abstention threshold, the
Predictor and `predict` apply it) compute them here, in float32 from float32 member logits,
so a threshold splits the same numbers the same way. `uq.metrics` holds the numpy twin
(same formula, float64) for reports; a test keeps torch, numpy and ONNX Runtime within 1e-6.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "UncertaintyOutputs",
    "as_deployed",
    "auroc",
    "entropy",
    "mean_probs",
    "mutual_information",
    "uncertainty_outputs",
]


class UncertaintyOutputs(NamedTuple):
    """Predictive distribution and its uncertainty decomposition.

    Shape:
        - probs: ``[B, C]`` mean over members of the member softmax.
        - entropy: ``[B]`` total (predictive) entropy ``H(probs)`` in nats.
        - mutual_info: ``[B]`` epistemic part (mutual information / BALD) in nats.
    """

    probs: torch.Tensor
    entropy: torch.Tensor
    mutual_info: torch.Tensor


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` as float64 if it already is, otherwise as float32."""
    if x.dtype == torch.float64:
        return x
    return x.to(torch.float32)


def _safe_log(p: torch.Tensor) -> torch.Tensor:
    """``log(p)`` with ``p`` clamped at the smallest normal float, so ``0 * log 0`` is 0."""
    return torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))


def _check_member_logits(member_logits: torch.Tensor) -> None:
    if member_logits.dim() != 3:
        raise ValueError(
            "member_logits must have shape [B, M, C] (batch, members, classes); "
            f"got {member_logits.dim()} dimensions with shape {tuple(member_logits.shape)}"
        )


def mean_probs(member_logits: torch.Tensor) -> torch.Tensor:
    """Average the members' softmax distributions.

    ``p_bar[b, c] = (1/M) * sum_m softmax(member_logits[b, m])[c]``. Computed in
    float32 (float64 if the input is float64), whatever the input dtype.

    Shape:
        - member_logits: ``[B, M, C]``
        - output: ``[B, C]``, rows sum to 1.
    """
    _check_member_logits(member_logits)
    return torch.softmax(_upcast(member_logits), dim=-1).mean(dim=1)


def entropy(probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy ``H(p) = -sum_c p_c * ln(p_c)`` in nats, with ``0 * ln 0 = 0``.

    Ranges over ``[0, ln C]``: 0 for a one-hot distribution, ``ln C`` for the uniform
    one. Computed in float32 (float64 if the input is float64).

    Shape:
        - probs: ``[..., C]`` (``C`` along ``dim``), non-negative, summing to 1 along ``dim``.
        - output: ``[...]``, i.e. ``probs`` with ``dim`` removed.
    """
    p = _upcast(probs)
    return -(p * _safe_log(p)).sum(dim=dim)


def _mutual_information_from_probs(member_probs: torch.Tensor, p_bar: torch.Tensor) -> torch.Tensor:
    # H(p_bar) - mean_m H(p_m) == mean_m sum_c p_mc * (ln p_mc - ln p_bar_c), i.e. the mean
    # KL divergence of each member from the mixture. This form avoids cancellation between two
    # large entropies and is exactly 0 when M == 1 (p_bar is then bitwise equal to p_1).
    log_ratio = _safe_log(member_probs) - _safe_log(p_bar).unsqueeze(1)
    mi = (member_probs * log_ratio).sum(dim=-1).mean(dim=1)
    return mi.clamp_min(0.0)


def mutual_information(member_logits: torch.Tensor) -> torch.Tensor:
    """Mutual information between the prediction and the member (epistemic uncertainty).

    ``MI = H(p_bar) - (1/M) * sum_m H(p_m)`` with ``p_m = softmax(member_logits[:, m])``
    and ``p_bar = mean_probs(member_logits)`` (the BALD score). It is evaluated in the
    equivalent form ``(1/M) * sum_m KL(p_m || p_bar)``, clamped at 0 against round-off.
    Range ``[0, ln min(M, C)]``; 0 when all members agree, and exactly 0 when ``M == 1``.

    Shape:
        - member_logits: ``[B, M, C]``
        - output: ``[B]``
    """
    _check_member_logits(member_logits)
    member_probs = torch.softmax(_upcast(member_logits), dim=-1)
    return _mutual_information_from_probs(member_probs, member_probs.mean(dim=1))


def uncertainty_outputs(member_logits: torch.Tensor) -> UncertaintyOutputs:
    """Predictive probabilities, total entropy and mutual information in one pass.

    Equivalent to ``(mean_probs(x), entropy(mean_probs(x)), mutual_information(x))`` but
    computes the member softmax once. Uses only ONNX-friendly ops, so it can sit at the end
    of an exported graph.

    Shape:
        - member_logits: ``[B, M, C]``
        - probs: ``[B, C]``; entropy: ``[B]``; mutual_info: ``[B]`` (all float32, or
          float64 for float64 input).
    """
    _check_member_logits(member_logits)
    member_probs = torch.softmax(_upcast(member_logits), dim=-1)
    p_bar = member_probs.mean(dim=1)
    return UncertaintyOutputs(
        probs=p_bar,
        entropy=entropy(p_bar),
        mutual_info=_mutual_information_from_probs(member_probs, p_bar),
    )


def as_deployed(member_logits: npt.ArrayLike) -> tuple[npt.NDArray[np.float32], ...]:
    """probs, entropy and mutual_info exactly as an exported graph computes them: this
    module's functions on float32 logits (already divided by the temperature, as the graph
    divides them). `calibrate` fits its abstention threshold on these values, and `predict`
    in torch applies it to them, so both split the scores the Predictor gets from ONNX
    Runtime (the same ops, in float32).

    Shape: member_logits `[N, M, C]` -> probs `[N, C]`, entropy `[N]`, mutual_info `[N]`,
    float32 numpy arrays.
    """
    logits = torch.from_numpy(np.ascontiguousarray(member_logits, dtype=np.float32))
    with torch.no_grad():
        outputs = uncertainty_outputs(logits)
    return outputs.probs.numpy(), outputs.entropy.numpy(), outputs.mutual_info.numpy()


def auroc(scores_in: torch.Tensor, scores_out: torch.Tensor) -> float:
    """AUROC of separating OOD (positive) from in-distribution by a score, higher = more OOD:
    the torch twin of `uq.metrics.ood_detection`'s "auroc" (same mid-rank formula; a test
    checks both against sklearn), for code that holds tensors (the circuit search).

    P(s_out > s_in) + 0.5 P(s_out == s_in), from mid-ranks (Mann-Whitney U / (n_in n_out));
    equals sklearn's `roc_auc_score` without needing it at runtime.

    Shape: scores_in `[N_in]`, scores_out `[N_out]` -> float.
    """
    n_in, n_out = scores_in.numel(), scores_out.numel()
    if n_in == 0 or n_out == 0:
        raise ValueError("auroc needs at least one in-distribution and one OOD score")
    scores = torch.cat([scores_in.reshape(-1), scores_out.reshape(-1)]).to(torch.float64)
    _, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)  # 1-based rank of each tie group's last member
    mid_rank = ends - (counts.to(torch.float64) - 1.0) / 2.0
    rank_sum_out = mid_rank[inverse][n_in:].sum()
    u_stat = rank_sum_out - n_out * (n_out + 1) / 2.0
    return float(u_stat / (n_in * n_out))
