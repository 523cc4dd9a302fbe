"""Classification and calibration metrics on predicted probabilities (numpy only).

This module must not import torch: it is also used in the torch-free ONNX Runtime
deployment environment.

Conventions: ``N`` examples, ``C`` classes. ``probs`` is a float array ``[N, C]`` whose rows
are probability distributions (non-negative, summing to 1; this is assumed, not checked);
``labels`` is an integer array ``[N]`` with values in ``[0, C)``. Every function validates
its inputs and raises ``ValueError`` on empty input, mismatched ``N``, wrong rank,
non-finite probabilities, non-integer labels or labels out of range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "accuracy",
    "brier",
    "classification_metrics",
    "ece",
    "nll",
    "reliability_bins",
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
    idx = np.searchsorted(edges, conf, side="right") - 1
    idx = np.clip(idx, 0, n_bins - 1)
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


def classification_metrics(probs: FloatArray, labels: IntArray) -> dict[str, float]:
    """All scalar metrics at their defaults, as plain (JSON-serialisable) Python floats.

    Returns ``{"acc": accuracy, "nll": nll, "brier": brier, "ece": ece}`` (ECE with 15 bins).

    Shape:
        - probs: ``[N, C]``; labels: ``[N]``; output: dict of scalars.
    """
    return {
        "acc": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels),
    }
