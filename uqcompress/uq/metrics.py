"""Classification and calibration metrics on predicted probabilities (numpy only).

This module must not import torch: it is also used in the torch-free ONNX Runtime
deployment environment.

Conventions: ``N`` examples, ``C`` classes. ``probs`` is a float array ``[N, C]`` whose rows
are probability distributions (non-negative, summing to 1; this is assumed, not checked);
``labels`` is an integer array ``[N]`` with values in ``[0, C)``. Every function validates
its inputs and raises ``ValueError`` on empty input, mismatched ``N``, wrong rank,
non-finite probabilities, non-integer labels or labels out of range.

Ensemble outputs ``member_probs`` are float arrays ``[N, M, C]`` with one probability row per
member ``m`` (``M >= 1``); the ensemble prediction is the mean over members. Uncertainty and
out-of-distribution (OOD) scores follow one convention: HIGHER means MORE uncertain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "accuracy",
    "aurc",
    "brier",
    "classification_metrics",
    "disagreement",
    "ece",
    "ece_change",
    "macro_f1",
    "matthews_corrcoef",
    "member_mutual_information",
    "nll",
    "ood_detection",
    "ood_set_names",
    "per_class_accuracy",
    "predictive_entropy",
    "reliability_bins",
    "softmax",
    "uncertainty_scores",
]

FloatArray = npt.NDArray[np.floating[Any]]
IntArray = npt.NDArray[np.integer[Any]]


def _validate(
    probs: FloatArray, labels: IntArray
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp]]:
    """Check shapes and ranges; return ``probs`` as float64 and ``labels`` as intp."""
    p = np.asarray(probs)
    y = np.asarray(labels)
    if p.ndim != 2:
        raise ValueError(f"probs must be a 2-D array [N, C]; got shape {p.shape}")
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-D array [N]; got shape {y.shape}")
    n, c = p.shape
    if n == 0:
        raise ValueError("probs and labels are empty (N = 0); metrics need at least one example")
    if c == 0:
        raise ValueError(f"probs has no classes (shape {p.shape}); expected [N, C] with C >= 1")
    if y.shape[0] != n:
        raise ValueError(
            f"probs and labels disagree on N: probs has {n} rows, labels has {y.shape[0]}"
        )
    if not (np.issubdtype(p.dtype, np.floating) or np.issubdtype(p.dtype, np.integer)):
        raise ValueError(f"probs must be a real-valued numeric array; got dtype {p.dtype}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be an integer array; got dtype {y.dtype}")
    p64 = p.astype(np.float64, copy=False)
    if not np.all(np.isfinite(p64)):
        raise ValueError("probs contains NaN or infinite values")
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= c:
        raise ValueError(
            f"labels must lie in [0, {c}) for probs with C = {c} classes; "
            f"got values in [{lo}, {hi}]"
        )
    return p64, y.astype(np.intp, copy=False)


def _check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer; got {n_bins!r}")


def accuracy(probs: FloatArray, labels: IntArray) -> float:
    """Top-1 accuracy: ``(1/N) * sum_i [argmax_c p_ic == y_i]``.

    Range ``[0, 1]``, higher is better. Ties in ``argmax`` go to the lowest class index.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: scalar.
    """
    p, y = _validate(probs, labels)
    return float(np.mean(np.argmax(p, axis=1) == y))


def nll(probs: FloatArray, labels: IntArray, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood of the true class (log loss, cross-entropy), in nats.

    ``NLL = -(1/N) * sum_i ln(max(p_{i, y_i}, eps))``. The clip at ``eps`` keeps a zero
    probability on the true class finite. Range ``[0, -ln eps]``, lower is better.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: scalar.
    """
    if not eps > 0:
        raise ValueError(f"eps must be positive; got {eps!r}")
    p, y = _validate(probs, labels)
    p_true = p[np.arange(p.shape[0]), y]
    return float(-np.mean(np.log(np.clip(p_true, eps, None))))


def brier(probs: FloatArray, labels: IntArray) -> float:
    """Multi-class Brier score: ``(1/N) * sum_i sum_c (p_ic - onehot(y_i)_c)^2``.

    Range ``[0, 2]``, lower is better. This is the original (Brier 1950) multi-class
    definition. For a binary problem it equals **2x** scikit-learn's
    ``brier_score_loss(y, probs[:, 1])``, which scores only the positive-class probability
    (range ``[0, 1]``); scikit-learn >= 1.7 with a ``[N, C]`` matrix and
    ``scale_by_half=False`` gives the same value as this function.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: scalar.
    """
    p, y = _validate(probs, labels)
    diff = p.copy()
    diff[np.arange(p.shape[0]), y] -= 1.0
    return float(np.mean(np.sum(diff * diff, axis=1)))


def _bin_index(conf: npt.NDArray[np.float64], n_bins: int) -> npt.NDArray[np.intp]:
    """The bin of each confidence (:func:`reliability_bins`' rule, against the edge values).

    Shape: conf ``[N]`` -> ``[N]`` in ``[0, n_bins)``.
    """
    edges = np.arange(n_bins + 1, dtype=np.float64) / n_bins
    return np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, n_bins - 1)


def reliability_bins(
    probs: FloatArray, labels: IntArray, n_bins: int = 15
) -> dict[str, npt.NDArray[Any]]:
    """Per-bin accuracy and confidence for reliability diagrams and ECE.

    Confidence is ``conf_i = max_c p_ic`` and the prediction is ``argmax_c p_ic``. The bins
    are ``n_bins`` equal-width intervals of ``[0, 1]`` with edges ``k / n_bins``. Binning
    rule: ``bin_i = min(floor(conf_i * n_bins), n_bins - 1)``, i.e. bins are closed on the
    left, ``[k/n_bins, (k+1)/n_bins)``, so a confidence exactly on an inner edge
    ``k/n_bins`` goes to the upper bin ``k``, and the last bin is closed on both sides so a
    confidence of exactly 1.0 falls in the LAST bin. The rule is applied against the edge
    values (``searchsorted``), so it holds even where ``conf * n_bins`` rounds below ``k``.

    Returns a dict of arrays:
        - ``edges``: ``[n_bins + 1]`` float, ``edges[k] = k / n_bins``.
        - ``count``: ``[n_bins]`` int, examples per bin.
        - ``accuracy``: ``[n_bins]`` float, fraction correct per bin (NaN where empty).
        - ``confidence``: ``[n_bins]`` float, mean confidence per bin (NaN where empty).

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; outputs as listed above.
    """
    _check_n_bins(n_bins)
    p, y = _validate(probs, labels)
    n_bins = int(n_bins)
    conf = np.max(p, axis=1)
    correct = (np.argmax(p, axis=1) == y).astype(np.float64)
    edges = np.arange(n_bins + 1, dtype=np.float64) / n_bins
    idx = _bin_index(conf, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.int64)
    acc_sum = np.bincount(idx, weights=correct, minlength=n_bins)
    conf_sum = np.bincount(idx, weights=conf, minlength=n_bins)
    nonempty = count > 0
    bin_acc = np.full(n_bins, np.nan, dtype=np.float64)
    bin_conf = np.full(n_bins, np.nan, dtype=np.float64)
    bin_acc[nonempty] = acc_sum[nonempty] / count[nonempty]
    bin_conf[nonempty] = conf_sum[nonempty] / count[nonempty]
    return {"edges": edges, "count": count, "accuracy": bin_acc, "confidence": bin_conf}


def ece(probs: FloatArray, labels: IntArray, n_bins: int = 15) -> float:
    """Expected calibration error (top-label, equal-width bins).

    ``ECE = sum_b (|b| / N) * |acc_b - conf_b|`` over the non-empty bins ``b`` of
    :func:`reliability_bins` (same binning rule: ``min(floor(conf * n_bins), n_bins - 1)``,
    confidence 1.0 in the last bin, a confidence exactly at ``k/n_bins`` in bin ``k``).
    Range ``[0, 1]``, lower is better; 0 means accuracy matches mean confidence in every bin.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: scalar.
    """
    bins = reliability_bins(probs, labels, n_bins=n_bins)
    count = bins["count"]
    nonempty = count > 0
    weights = count[nonempty] / count.sum()
    gaps = np.abs(bins["accuracy"][nonempty] - bins["confidence"][nonempty])
    return float(np.sum(weights * gaps))


def ece_change(before: FloatArray, after: FloatArray, labels: IntArray, n_bins: int = 15) -> float:
    """How much the ECE of a model changed from ``before`` to ``after`` (the same examples),
    with both binned by ``before``'s confidence: ``ECE'(after) - ECE(before)``, where
    ``ECE'`` uses the bins :func:`reliability_bins` puts ``before``'s rows in.

    Why not ``ece(after) - ece(before)``: that difference is discontinuous in the
    probabilities. A confidence change of 1e-6 that moves a row across a bin edge moves two
    bins' accuracies at once, by about ``1 / |bin|`` each, so on a few hundred rows the
    plain difference of two nearly identical models can exceed 0.01. With the bins held
    fixed the change is bounded by what really changed:
    ``|change| <= (rows whose correctness changed) / N + mean_i |conf'_i - conf_i|``,
    and it is 0 for identical probabilities. A model that really grows over- or
    under-confident still moves it by the size of that shift.

    Shape:
        - before, after: ``[N, C]``; labels: ``[N]``; output: scalar in ``[-1, 1]``.
    """
    _check_n_bins(n_bins)
    p0, y = _validate(before, labels)
    p1, _ = _validate(after, labels)
    if p0.shape != p1.shape:
        raise ValueError(
            f"before and after must have the same shape; got {p0.shape} and {p1.shape}"
        )
    idx = _bin_index(np.max(p0, axis=1), int(n_bins))

    def binned_ece(p: npt.NDArray[np.float64]) -> float:
        correct = (np.argmax(p, axis=1) == y).astype(np.float64)
        gap = np.bincount(idx, weights=correct - np.max(p, axis=1), minlength=n_bins)
        return float(np.sum(np.abs(gap)) / len(y))

    return binned_ece(p1) - binned_ece(p0)


def _confusion(probs: FloatArray, labels: IntArray) -> npt.NDArray[np.int64]:
    """Shape: probs `[N, C]`, labels `[N]` -> counts `[C, C]` (row: true class, column:
    predicted class, the argmax with ties to the lowest index)."""
    p, y = _validate(probs, labels)
    classes = p.shape[1]
    counts = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(counts, (y, np.argmax(p, axis=1)), 1)
    return counts


def macro_f1(probs: FloatArray, labels: IntArray) -> float:
    """Macro-averaged F1: the mean over classes of ``2 TP / (2 TP + FP + FN)``, over the
    classes that occur as a label or a prediction (scikit-learn's ``f1_score(average="macro")``
    on those labels). Range ``[0, 1]``, higher is better.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: scalar.
    """
    counts = _confusion(probs, labels)
    tp = np.diag(counts).astype(np.float64)
    fp = counts.sum(axis=0) - tp
    fn = counts.sum(axis=1) - tp
    seen = (tp + fp + fn) > 0
    return float(np.mean(2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])))


def matthews_corrcoef(probs: FloatArray, labels: IntArray) -> float:
    """Matthews correlation coefficient, multiclass (Gorodkin's R_K, scikit-learn's
    ``matthews_corrcoef``): ``(c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k
    t_k^2))`` with c correct, s examples, p_k predicted and t_k true counts of class k; 0 when
    a denominator factor is 0 (e.g. one class predicted for everything). Range ``[-1, 1]``.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: scalar.
    """
    counts = _confusion(probs, labels).astype(np.float64)
    true, predicted = counts.sum(axis=1), counts.sum(axis=0)
    correct, total = np.trace(counts), counts.sum()
    denominator = (total**2 - predicted @ predicted) * (total**2 - true @ true)
    if denominator == 0:
        return 0.0
    return float((correct * total - predicted @ true) / np.sqrt(denominator))


def per_class_accuracy(probs: FloatArray, labels: IntArray) -> list[float | None]:
    """Per class, the share of its examples predicted as it (its recall); None for a class
    with no example.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: C values.
    """
    counts = _confusion(probs, labels)
    support = counts.sum(axis=1)
    return [float(counts[k, k] / support[k]) if support[k] else None for k in range(len(support))]


def classification_metrics(probs: FloatArray, labels: IntArray) -> dict[str, float]:
    """All scalar metrics at their defaults, as plain (JSON-serialisable) Python floats.

    Returns ``{"acc", "f1_macro", "mcc", "nll", "brier", "ece"}`` (ECE with 15 bins).

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: dict of scalars.
    """
    return {
        "acc": accuracy(probs, labels),
        "f1_macro": macro_f1(probs, labels),
        "mcc": matthews_corrcoef(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels),
    }


# --------------------------------------------------------------------------- uncertainty / OOD


def _validate_prob_array(probs: FloatArray, ndim: int, name: str) -> npt.NDArray[np.float64]:
    """Check rank, non-emptiness, dtype and finiteness of a probability array; return float64."""
    p = np.asarray(probs)
    layout = "[N, C]" if ndim == 2 else "[N, M, C]"
    if p.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-D array {layout}; got shape {p.shape}")
    if p.shape[0] == 0:
        raise ValueError(f"{name} is empty (N = 0); metrics need at least one example")
    if any(d == 0 for d in p.shape[1:]):
        raise ValueError(f"{name} has an empty axis (shape {p.shape}); expected {layout} >= 1")
    if not (np.issubdtype(p.dtype, np.floating) or np.issubdtype(p.dtype, np.integer)):
        raise ValueError(f"{name} must be a real-valued numeric array; got dtype {p.dtype}")
    p64 = p.astype(np.float64, copy=False)
    if not np.all(np.isfinite(p64)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return p64


def _safe_log(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``ln p`` with ``p`` clamped at the smallest normal float, so ``0 * ln 0`` is 0 (as
    ``uq.functional._safe_log``)."""
    return np.asarray(np.log(np.maximum(p, np.finfo(p.dtype).tiny)))


def _entropy(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Shannon entropy in nats along the last axis, with ``0 ln 0 = 0``: the numpy twin of
    ``uq.functional.entropy`` (same formula, see that module's docstring)."""
    return np.asarray(-np.sum(p * _safe_log(p), axis=-1))


def _mutual_information(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``mean_m KL(p_m || mean_m p_m)``, clamped at 0: the numpy twin of the mutual information
    in ``uq.functional`` (same formula). Shape: ``[N, M, C]`` -> ``[N]``."""
    log_ratio = _safe_log(p) - _safe_log(p.mean(axis=1))[:, None, :]
    return np.asarray(np.maximum((p * log_ratio).sum(axis=-1).mean(axis=1), 0.0))


def softmax(logits: npt.NDArray[Any], axis: int = -1) -> npt.NDArray[np.float64]:
    """Numerically stable softmax in float64.

    Shape: any `[..., C]` -> the same shape, summing to 1 over `axis`.
    """
    shifted = np.asarray(logits, dtype=np.float64)
    shifted = shifted - shifted.max(axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=axis, keepdims=True), dtype=np.float64)


def predictive_entropy(probs: FloatArray) -> npt.NDArray[np.float64]:
    """Entropy of each predictive distribution, in nats (natural log).

    ``H_i = -sum_c p_ic * ln(p_ic)`` with the convention ``0 * ln 0 = 0``. Range
    ``[0, ln C]``: 0 for a one-hot row, ``ln C`` for the uniform distribution. Higher means
    more uncertain.

    Shape:
        - probs: ``[N, C]``; output: ``[N]`` float64.
    """
    p = _validate_prob_array(probs, 2, "probs")
    return _entropy(p)


def member_mutual_information(member_probs: FloatArray) -> npt.NDArray[np.float64]:
    """Mutual information between the prediction and the member (epistemic uncertainty).

    ``MI_i = H(mean_m p_imc) - mean_m H(p_im.)`` in nats (the BALD / Jensen-Shannon
    disagreement score), evaluated as ``mean_m KL(p_im || mean_m p_im)`` and clamped at 0:
    the one definition of ``uq.functional`` (the exported graph's), in float64. Range
    ``[0, min(ln C, ln M)]``; exactly 0 when all members agree and for a single member.

    Shape:
        - member_probs: ``[N, M, C]``; output: ``[N]`` float64.
    """
    p = _validate_prob_array(member_probs, 3, "member_probs")
    if p.shape[1] == 1:
        return np.zeros(p.shape[0], dtype=np.float64)
    return _mutual_information(p)


def uncertainty_means(member_probs: FloatArray) -> dict[str, float]:
    """Test-set means of an ensemble's uncertainty decomposition, in nats (TorchUncertainty's
    ensemble metrics): ``"entropy"`` = H(mean_m p_m) (predictive, total), ``"aleatoric"`` =
    mean_m H(p_m) (expected entropy) and ``"mi"`` = the mutual information (epistemic), the
    mean KL of each member from the mixture, so entropy = aleatoric + mi up to round-off.

    Shape: member_probs ``[N, M, C]`` -> dict of floats.
    """
    p = _validate_prob_array(member_probs, 3, "member_probs")
    return {
        "entropy": float(_entropy(p.mean(axis=1)).mean()),
        "aleatoric": float(_entropy(p).mean()),
        "mi": float(_mutual_information(p).mean()),
    }


def uncertainty_scores(member_probs: FloatArray) -> dict[str, npt.NDArray[np.float64]]:
    """Per-example uncertainty scores of the ensemble; every score: higher = more uncertain.

    With ``pbar_ic = mean_m p_imc`` (the ensemble prediction):
        - ``"msp"``: ``1 - max_c pbar_ic`` (one minus the maximum softmax probability),
          range ``[0, 1 - 1/C]``.
        - ``"entropy"``: :func:`predictive_entropy` of ``pbar``, range ``[0, ln C]``.
        - ``"mi"``: :func:`member_mutual_information`, only present when ``M > 1``.

    Shape:
        - member_probs: ``[N, M, C]``; output: dict of ``[N]`` float64 arrays.
    """
    p = _validate_prob_array(member_probs, 3, "member_probs")
    mean = p.mean(axis=1)
    scores: dict[str, npt.NDArray[np.float64]] = {
        "msp": 1.0 - np.max(mean, axis=1),
        "entropy": _entropy(mean),
    }
    if p.shape[1] > 1:
        scores["mi"] = member_mutual_information(p)
    return scores


def _validate_scores(scores: FloatArray, name: str) -> npt.NDArray[np.float64]:
    s = np.asarray(scores)
    if s.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array [N]; got shape {s.shape}")
    if s.shape[0] == 0:
        raise ValueError(f"{name} is empty; OOD detection needs at least one score per set")
    if not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
        raise ValueError(f"{name} must be a real-valued numeric array; got dtype {s.dtype}")
    s64 = s.astype(np.float64, copy=False)
    if not np.all(np.isfinite(s64)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return s64


def ood_set_names(metrics: Iterable[Mapping[str, Any]]) -> list[str]:
    """The OOD sets named by metric keys `ood.<set>.<score>.<metric>` of any of `metrics`
    (eval's metrics.json dicts), in the order they first appear."""
    names: list[str] = []
    for each in metrics:
        for key in each:
            parts = key.split(".")
            if parts[0] == "ood" and len(parts) == 4 and parts[1] not in names:
                names.append(parts[1])
    return names


def ood_detection(scores_in: FloatArray, scores_out: FloatArray) -> dict[str, float]:
    """Threshold-free OOD detection metrics, OOD = POSITIVE class, higher score = more OOD.

    With ``n_in`` in-distribution scores ``s_in`` and ``n_out`` OOD scores ``s_out``:
        - ``"auroc"``: ``P(s_out > s_in) + 0.5 * P(s_out == s_in)`` over all pairs (the
          Mann-Whitney U statistic / (n_in * n_out), computed from mid-ranks). Range
          ``[0, 1]``; 1 = perfectly separated, 0.5 = chance, 0 = perfectly reversed. Equals
          ``sklearn.metrics.roc_auc_score``.
        - ``"aupr"``: average precision ``sum_k (R_k - R_{k-1}) * P_k`` over the distinct
          score thresholds ``t_k`` in decreasing order (tied scores form one threshold),
          where ``P_k`` / ``R_k`` are precision / recall of flagging ``s >= t_k`` and
          ``R_0 = 0``. Range ``(0, 1]``; chance level is ``n_out / (n_in + n_out)``. Equals
          ``sklearn.metrics.average_precision_score`` (step-wise, no interpolation).
        - ``"fpr95"``: false-positive rate (fraction of in-distribution flagged) at the first
          of those thresholds whose true-positive rate (fraction of OOD flagged) is
          ``>= 0.95``; equals ``fpr[argmax(tpr >= 0.95)]`` of
          ``sklearn.metrics.roc_curve(..., drop_intermediate=False)``. Range ``[0, 1]``,
          lower is better.

    Raises ``ValueError`` for empty, non-1-D or non-finite (NaN / inf) inputs.

    Shape:
        - scores_in: ``[N_in]``; scores_out: ``[N_out]``; output: dict of scalars.
    """
    s_in = _validate_scores(scores_in, "scores_in")
    s_out = _validate_scores(scores_out, "scores_out")
    n_in, n_out = s_in.shape[0], s_out.shape[0]
    scores = np.concatenate([s_in, s_out])
    is_out = np.concatenate([np.zeros(n_in), np.ones(n_out)])

    # AUROC from mid-ranks (ties share the mean of their ranks).
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    first_rank = np.cumsum(counts) - counts + 1  # 1-based rank of each group's first element
    mid_rank = first_rank + (counts - 1) / 2.0
    rank_sum_out = float(np.sum(mid_rank[inverse.reshape(-1)][n_in:]))
    u_stat = rank_sum_out - n_out * (n_out + 1) / 2.0
    auroc = u_stat / (n_in * n_out)

    # Cumulative TP / FP counts at each distinct threshold, from the highest score down.
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    sorted_pos = is_out[order]
    last_of_group = np.r_[np.nonzero(np.diff(sorted_scores))[0], scores.shape[0] - 1]
    tps = np.cumsum(sorted_pos)[last_of_group]
    fps = (last_of_group + 1) - tps
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    aupr = float(np.sum(np.diff(np.r_[0.0, recall]) * precision))

    fpr = fps / fps[-1]
    fpr95 = float(fpr[np.argmax(recall >= 0.95)])
    return {"auroc": float(auroc), "aupr": aupr, "fpr95": fpr95}


def aurc(probs: FloatArray, labels: IntArray, residual: FloatArray | None = None) -> float:
    """Area under the risk-coverage curve of selective prediction (lower is better).

    The prediction is ``argmax_c p_ic``; examples are ranked by confidence, most confident
    first. The ranking uses ``residual`` (``1 - confidence``, e.g. `confidence_residual` of
    the member logits, exact in float64 where ``max_c p_ic`` has rounded to 1.0) when given,
    else ``1 - max_c p_ic`` in float64. Tied confidences form ONE threshold group: a
    threshold accepts all of them or none, so each example of a group gets the risk at the
    group's end, and the result does not depend on the order of the rows. With ``e_(j)`` = 1
    if the j-th most confident prediction is wrong and ``g(k)`` the last position of the
    tie group holding position ``k``:

        ``risk(k) = (1/g(k)) * sum_{j<=g(k)} e_(j)``,  ``AURC = (1/N) * sum_{k=1..N} risk(k)``.

    Without ties this is the usual AURC. Range ``[0, 1]``: 0 when every prediction is
    correct, 1 when every one is wrong; all confidences tied gives the error rate. For a
    fixed number of errors ``E`` and distinct confidences the minimum is reached by a
    perfect ranking (all errors least confident): ``(1/N) * sum_{k=N-E+1..N} (k - N + E) / k``.

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; residual: ``[N]``; output: scalar.
    """
    p, y = _validate(probs, labels)
    n = p.shape[0]
    if residual is None:
        rest = 1.0 - np.max(p, axis=1)
    else:
        rest = np.asarray(residual, dtype=np.float64)
        if rest.shape != (n,) or not np.all(np.isfinite(rest)):
            raise ValueError(f"residual must be {n} finite values; got shape {rest.shape}")
    errors = (np.argmax(p, axis=1) != y).astype(np.float64)
    order = np.argsort(rest, kind="stable")  # most confident first; ties grouped below
    ranked = rest[order]
    cumulative = np.cumsum(errors[order])
    # last position of each tie group, broadcast to every position of that group
    ends = np.searchsorted(ranked, ranked, side="right") - 1
    risk = cumulative[ends] / (ends + 1)
    return float(np.mean(risk))


def confidence_residual(
    member_logits: FloatArray, predicted: IntArray | None = None
) -> npt.NDArray[np.float64]:
    """``1 - max_c pbar_c`` of the ensemble's mean ``pbar = mean_m softmax(z_m)``, in
    float64 without the cancellation of ``1 - p``: ``mean_m sum_{c != k} p_mc`` with ``k``
    the predicted class (default ``argmax_c pbar_c``). It separates confidences that round
    to 1.0 in float32 (a logit gap of 17 or more) or float64 (37 or more), for `aurc`.

    Shape: member_logits ``[N, M, C]``; predicted ``[N]`` -> ``[N]``.
    """
    z = np.asarray(member_logits, dtype=np.float64)
    if z.ndim != 3:
        raise ValueError(f"member_logits must be [N, M, C]; got shape {z.shape}")
    member = softmax(z)  # [N, M, C], float64
    k = np.argmax(member.mean(axis=1), axis=1) if predicted is None else np.asarray(predicted)
    others = np.ones(z.shape[::2], dtype=bool)  # [N, C]
    others[np.arange(z.shape[0]), k] = False
    return np.asarray((member * others[:, None, :]).sum(axis=2).mean(axis=1), dtype=np.float64)


def disagreement(member_probs: FloatArray) -> float:
    """Mean fraction of members whose top-1 class differs from the ensemble's top-1 class.

    ``D = (1/N) * sum_i (1/M) * sum_m [argmax_c p_imc != argmax_c pbar_ic]`` with
    ``pbar_ic = mean_m p_imc``; ``argmax`` ties go to the lowest class index. Range
    ``[0, 1]`` (the mean can favour a class that no member ranks first); 0 for identical
    members and for ``M = 1``.

    Shape:
        - member_probs: ``[N, M, C]``; output: scalar.
    """
    p = _validate_prob_array(member_probs, 3, "member_probs")
    if p.shape[1] == 1:
        return 0.0
    ens_pred = np.argmax(p.mean(axis=1), axis=1)
    member_pred = np.argmax(p, axis=2)
    return float(np.mean(member_pred != ens_pred[:, None]))
