"""The figure of `uqc compare`: several models' headline numbers and diagrams, drawn from
their numbers (not their PNGs scaled down), so every label stays legible at 100%.

Top: one horizontal bar panel per headline metric (accuracy, ECE, OOD AUROC by predictive
entropy, model latency), a bar per model, its value printed at the bar. Below: a grid with
each model's reliability diagram and, where its eval had OOD data, its entropy histograms
with the AUROC in the legend; two models per row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.uq.plots import (
    HEADLINE_SCORE,
    draw_ood,
    draw_reliability,
    drawn,
    reliability_stats,
    save_figure,
    styled,
    wrap,
)

__all__ = ["ComparedModel", "comparison_figure", "save_comparison"]


@dataclass(frozen=True)
class ComparedModel:
    """One model of a comparison: its row name, its eval's metrics, its reliability bins
    (None: not recorded) and its per-example entropy scores in and out of distribution
    (None: not recorded, an eval written before they were kept).

    Shape:
        - bins: as ``metrics.reliability_bins``; in_entropy: ``[N]``;
          ood_entropy: set -> ``[N_set]``.
    """

    name: str
    metrics: Mapping[str, Any]
    bins: Mapping[str, npt.NDArray[Any]] | None = None
    in_entropy: npt.NDArray[Any] | None = None
    ood_entropy: Mapping[str, npt.NDArray[Any]] = field(default_factory=dict)


def _headline_metrics(models: list[ComparedModel], ood_set: str | None) -> list[tuple[str, str]]:
    """(metric key, axis label) of each summary panel, the OOD one only with an OOD set."""
    panels = [("acc", "accuracy (higher is better)"), ("ece", "ECE (lower is better)")]
    if ood_set is not None:
        key = f"ood.{ood_set}.{HEADLINE_SCORE}.auroc"
        panels.append((key, f"OOD AUROC vs {ood_set} (higher is better)"))
    if any("latency_ms" in m.metrics for m in models):
        panels.append(("latency_ms", "ms / example, model only (lower is better)"))
    return panels


def _draw_summary(subfig: Any, models: list[ComparedModel], ood_set: str | None) -> None:
    panels = _headline_metrics(models, ood_set)
    axes = subfig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    positions = np.arange(len(models))
    for ax, (key, label) in zip(axes, panels, strict=True):
        values = [m.metrics.get(key) for m in models]
        shown = [float(v) if isinstance(v, int | float) else np.nan for v in values]
        ax.barh(positions, np.nan_to_num(shown), color="tab:blue", height=0.6)
        top = max((v for v in shown if np.isfinite(v)), default=1.0) or 1.0
        for y, value in zip(positions, shown, strict=True):
            text = "-" if not np.isfinite(value) else f"{value:.3f}"
            ax.text(max(value, 0.0) if np.isfinite(value) else 0.0, y, f" {text}", va="center")
        ax.set_xlim(0, top * 1.3)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(positions, [wrap(m.name, 40) for m in models])
    axes[0].invert_yaxis()  # the first model on top, as in the table


def _draw_model(ax_rel: Any, ax_ood: Any | None, model: ComparedModel, data: str) -> None:
    title = wrap(model.name, 48)
    if model.bins is not None:
        stats = reliability_stats(model.bins)
        draw_reliability(ax_rel, stats, legend=False)
        ax_rel.set_title(f"{title}\nECE {stats['ece']:.3f}, accuracy {stats['acc']:.3f}")
    else:
        ax_rel.set_axis_off()
        ax_rel.set_title(f"{title}\nno reliability bins recorded")
    if ax_ood is None:
        return
    if model.in_entropy is None or not model.ood_entropy:
        ax_ood.set_axis_off()
        ax_ood.set_title(f"{title}\nno OOD scores recorded (re-run its eval)")
        return
    draw_ood(ax_ood, HEADLINE_SCORE, model.in_entropy, model.ood_entropy, in_label=data)
    ax_ood.set_title(f"{title}\nOOD by predictive entropy")


def comparison_figure(models: list[ComparedModel], data: str) -> Any:
    """The comparison figure of `models` (at least one), all evaluated on `data`."""
    if not models:
        raise ValueError("models is empty; pass at least one ComparedModel")
    from matplotlib.patches import Patch

    from uqcompress.uq.metrics import ood_set_names

    ood_set = next(iter(ood_set_names(m.metrics for m in models)), None)
    with_ood = any(m.ood_entropy for m in models)
    per_model = 2 if with_ood else 1
    cols = 4
    rows = -(-len(models) * per_model // cols)
    summary_height = 1.4 + 0.38 * len(models)

    def draw(fig: Any) -> None:
        top, grid = fig.subfigures(2, 1, height_ratios=[summary_height, 3.4 * rows])
        _draw_summary(top, models, ood_set)
        top.suptitle(f"{len(models)} models on {data}", fontsize=12)
        axes = grid.subplots(rows, cols, squeeze=False).reshape(-1)
        for i, model in enumerate(models):
            ax_rel = axes[i * per_model]
            ax_ood = axes[i * per_model + 1] if with_ood else None
            _draw_model(ax_rel, ax_ood, model, data)
        for ax in axes[len(models) * per_model :]:
            ax.set_visible(False)
        grid.legend(
            handles=[
                Patch(facecolor="tab:blue", edgecolor="black", label="accuracy in bin"),
                Patch(facecolor="none", edgecolor="tab:red", hatch="///", label="gap to conf."),
                Patch(facecolor="black", label="mean confidence (tick)"),
                Patch(facecolor="white", edgecolor="gray", ls="--", label="perfect calibration"),
            ],
            loc="outside upper center",
            ncols=4,
        )

    with styled() as plt:
        height = summary_height + 3.4 * rows + 0.6
        fig = plt.figure(figsize=(4.0 * cols, height), layout="constrained")
        return drawn(draw, plt, fig)


def save_comparison(models: list[ComparedModel], data: str, path: Path) -> None:
    """Write `comparison_figure(models, data)` as a PNG at `path`."""
    save_figure(comparison_figure(models, data), path)
