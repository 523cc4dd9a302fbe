"""Diagnostic plots (PNG) for calibration and out-of-distribution detection.

matplotlib is imported inside the functions, with the non-interactive ``Agg`` backend, so
importing this module is cheap and never needs a display. Every function writes one PNG
(creating missing parent folders) and closes its figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["save_ood_histograms", "save_reliability_diagram", "save_training_curves"]

_DPI = 110
_SCORE_LABELS = {
    "msp": "1 - max probability",
    "entropy": "predictive entropy (nats)",
    "mi": "mutual information (nats)",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    plt = _pyplot()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=_DPI, format="png")
    finally:
        plt.close(fig)


def save_reliability_diagram(bins: Mapping[str, npt.NDArray[Any]], path: Path, title: str) -> None:
    """Write a reliability diagram of ``bins`` (the dict of ``metrics.reliability_bins``).

    Top panel: per-bin accuracy as bars over the confidence bins, the gap to the bin's mean
    confidence as hatched bars, and the diagonal (perfect calibration); the annotation gives
    the count-weighted ECE ``sum_b (|b| / N) * |acc_b - conf_b|`` over the non-empty bins.
    Bottom panel: fraction of examples per bin. Empty bins (NaN accuracy) are left blank.

    Shape:
        - bins: ``edges [B + 1]``, ``count [B]``, ``accuracy [B]``, ``confidence [B]``.
    """
    missing = {"edges", "count", "accuracy", "confidence"} - set(bins)
    if missing:
        raise ValueError(f"bins is missing keys {sorted(missing)}; pass reliability_bins(...)")
    edges = np.asarray(bins["edges"], dtype=np.float64)
    count = np.asarray(bins["count"], dtype=np.float64)
    acc = np.asarray(bins["accuracy"], dtype=np.float64)
    conf = np.asarray(bins["confidence"], dtype=np.float64)
    n_bins = edges.shape[0] - 1
    if edges.ndim != 1 or n_bins < 1:
        raise ValueError(f"bins['edges'] must be 1-D with >= 2 values; got shape {edges.shape}")
    if not (count.shape == acc.shape == conf.shape == (n_bins,)):
        raise ValueError(
            f"bins arrays disagree: edges {edges.shape}, count {count.shape}, "
            f"accuracy {acc.shape}, confidence {conf.shape}; expected [B + 1] and [B]"
        )
    total = float(count.sum())
    nonempty = (count > 0) & np.isfinite(acc) & np.isfinite(conf)
    ece = (
        float(np.sum(count[nonempty] / total * np.abs(acc[nonempty] - conf[nonempty])))
        if total > 0
        else float("nan")
    )

    plt = _pyplot()
    fig, (ax, ax_count) = plt.subplots(
        2, 1, figsize=(5, 4), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    try:
        left = edges[:-1][nonempty]
        width = np.diff(edges)[nonempty]
        ax.bar(
            left,
            acc[nonempty],
            width=width,
            align="edge",
            color="tab:blue",
            edgecolor="black",
            linewidth=0.5,
            label="accuracy",
        )
        gap_bottom = np.minimum(acc[nonempty], conf[nonempty])
        gap_height = np.abs(conf[nonempty] - acc[nonempty])
        ax.bar(
            left,
            gap_height,
            bottom=gap_bottom,
            width=width,
            align="edge",
            color="tab:red",
            alpha=0.3,
            hatch="//",
            edgecolor="tab:red",
            linewidth=0.5,
            label="gap",
        )
        ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylim(0, 1)
        ax.set_ylabel("accuracy")
        ax.set_title(title, fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
        ax.text(
            0.97,
            0.05,
            f"ECE = {ece:.4f}\nN = {int(total)}",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8},
        )
        frac = count / total if total > 0 else count
        ax_count.bar(
            edges[:-1],
            frac,
            width=np.diff(edges),
            align="edge",
            color="gray",
            edgecolor="black",
            linewidth=0.5,
        )
        ax_count.set_xlabel("confidence (max probability)")
        ax_count.set_ylabel("fraction", fontsize=8)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    _save(fig, path)


def save_ood_histograms(
    in_scores: Mapping[str, npt.NDArray[Any]],
    ood_scores: Mapping[str, Mapping[str, npt.NDArray[Any]]],
    path: Path,
    title: str,
) -> None:
    """Write overlaid density histograms of in-distribution vs OOD uncertainty scores.

    One subplot per score name in ``in_scores`` (e.g. ``msp``, ``entropy`` and, for
    ensembles, ``mi``), in its order. Each subplot shows the in-distribution scores (filled)
    and every OOD set of ``ood_scores`` (``set name -> score name -> values``) that has that
    score (outlined), on shared bin edges, normalised as densities. Non-finite values are
    dropped.

    Shape:
        - in_scores: ``name -> [N_in]``; ood_scores: ``set -> name -> [N_set]``.
    """
    if not in_scores:
        raise ValueError("in_scores is empty; expected e.g. {'msp': ..., 'entropy': ...}")
    names = list(in_scores)

    def finite(values: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        return v[np.isfinite(v)]

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5), squeeze=False)
    try:
        for ax, name in zip(axes[0], names, strict=True):
            base = finite(in_scores[name])
            sets = {
                set_name: finite(scores[name])
                for set_name, scores in ood_scores.items()
                if name in scores
            }
            pooled = np.concatenate([base, *sets.values()])
            edges = np.histogram_bin_edges(pooled if pooled.size else np.zeros(1), bins=30)
            if base.size:
                ax.hist(
                    base,
                    bins=edges,
                    density=True,
                    alpha=0.45,
                    color="tab:blue",
                    label=f"in-dist (n={base.size})",
                )
            for set_name, values in sets.items():
                if values.size:
                    ax.hist(
                        values,
                        bins=edges,
                        density=True,
                        histtype="step",
                        linewidth=1.5,
                        label=f"{set_name} (n={values.size})",
                    )
            ax.set_xlabel(_SCORE_LABELS.get(name, name))
            ax.set_ylabel("density")
            ax.set_title(name, fontsize=10)
            ax.legend(fontsize=7)
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    _save(fig, path)


def save_training_curves(
    history: list[Mapping[str, Any]], path: Path, title: str, best_epoch: int | None = None
) -> None:
    """Write a training run's curves over its epochs: the training loss and, where present,
    the validation loss in the first panel, every other `val_` metric (acc, nll, ece) in the
    second, the learning rate at each epoch's end in the third; `best_epoch` (1-based, the
    weights kept) is marked by a dashed line.

    Shape:
        - history: one mapping per epoch with `epoch`, `train_loss`, `lr` and `val_*` floats.
    """
    if not history:
        raise ValueError("history is empty; expected one row per epoch")
    epochs = [int(row["epoch"]) for row in history]
    val_names = [k for k in history[0] if k.startswith("val_") and k != "val_loss"]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    try:
        loss_ax, val_ax, lr_ax = axes
        loss_ax.plot(epochs, [row["train_loss"] for row in history], marker="o", label="train")
        if "val_loss" in history[0]:
            loss_ax.plot(epochs, [row["val_loss"] for row in history], marker="o", label="val")
        loss_ax.set_title("loss", fontsize=10)
        loss_ax.legend(fontsize=8)
        for name in val_names:
            val_ax.plot(epochs, [row[name] for row in history], marker="o", label=name)
        val_ax.set_title("validation" if val_names else "validation (no --val)", fontsize=10)
        if val_names:
            val_ax.legend(fontsize=8)
        lr_ax.plot(epochs, [row["lr"] for row in history], marker="o", color="gray")
        lr_ax.set_title("learning rate at epoch end", fontsize=10)
        for ax in axes:
            ax.set_xlabel("epoch")
            if best_epoch is not None:
                ax.axvline(best_epoch, linestyle="--", color="tab:red", linewidth=1)
        fig.suptitle(title + (f" (kept: epoch {best_epoch})" if best_epoch else ""), fontsize=11)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    _save(fig, path)
