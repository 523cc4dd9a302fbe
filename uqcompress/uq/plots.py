"""Diagnostic plots (PNG) for calibration, out-of-distribution detection and training.

Every plot is drawn for a reader who sees only the picture: its title names the model, the
data and the headline number (ECE, OOD AUROC, the kept epoch's validation metric), every
axis is labelled, every mark drawn has a legend entry that looks like it, and no text is
smaller than 9 pt (`MIN_FONT_PT`) at the saved resolution.

Each plot has a `*_figure` function that returns the matplotlib figure (tests inspect its
titles, labels and fonts) and a `save_*` function that draws, writes one PNG (creating
missing parent folders) and closes the figure. matplotlib is imported inside the functions,
with the non-interactive ``Agg`` backend, so importing this module is cheap and never needs
a display.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MIN_FONT_PT",
    "history_figure",
    "ood_figure",
    "reliability_figure",
    "save_figure",
    "save_ood_histograms",
    "save_reliability_diagram",
    "save_training_curves",
]

DPI = 110
MIN_FONT_PT = 9.0
# Every text size the plots use: nothing below MIN_FONT_PT, titles a step larger.
STYLE = {
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 9.0,
    "ytick.labelsize": 9.0,
    "legend.fontsize": 9.0,
    "legend.title_fontsize": 9.0,
    "figure.titlesize": 11.0,
}
SCORE_LABELS = {
    "msp": "1 - max probability",
    "entropy": "predictive entropy (nats)",
    "mi": "mutual information (nats)",
}
# The score whose AUROC the OOD title reports: every model has it (MI needs M > 1).
HEADLINE_SCORE = "entropy"
_TRAIN_KEYS = {"epoch", "steps", "lr", "train_loss", "val_loss"}
_METRIC_LABELS = {"acc": "accuracy", "nll": "NLL (nats)", "ece": "ECE", "loss": "loss"}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextmanager
def styled() -> Iterator[Any]:
    """pyplot with the plots' font sizes in effect (text takes its size when created)."""
    plt = pyplot()
    with plt.rc_context(STYLE):
        yield plt


def save_figure(fig: Any, path: Path) -> None:
    """Write `fig` as a PNG at `path` (parents created) and close it, also on failure."""
    plt = pyplot()
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI, format="png")
    finally:
        plt.close(fig)


def drawn(draw: Callable[[Any], None], plt: Any, fig: Any) -> Any:
    """Run `draw(fig)`; a failure closes the figure before it propagates."""
    try:
        draw(fig)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def wrap(text: str, width: int = 44) -> str:
    """`text` broken into lines of at most `width` characters (long model names)."""
    return "\n".join(textwrap.wrap(text, width)) or text


def finite(values: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """The finite values of `values`, flattened, as float64. Shape: [...] -> [K]."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    return flat[np.isfinite(flat)]


def reliability_stats(bins: Mapping[str, npt.NDArray[Any]]) -> dict[str, Any]:
    """The arrays of ``metrics.reliability_bins`` checked, and the numbers a diagram states.

    Returns ``edges``, ``count``, ``accuracy``, ``confidence`` as float64 arrays, the mask of
    non-empty bins, ``total`` examples, the count-weighted ``ece``
    ``sum_b (|b| / N) * |acc_b - conf_b|`` and the overall ``acc`` (count-weighted bin
    accuracy).

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
    weights = count[nonempty] / total if total > 0 else count[nonempty]
    nan = float("nan")
    return {
        "edges": edges,
        "count": count,
        "accuracy": acc,
        "confidence": conf,
        "nonempty": nonempty,
        "total": total,
        "ece": float(np.sum(weights * np.abs(acc[nonempty] - conf[nonempty]))) if total else nan,
        "acc": float(np.sum(weights * acc[nonempty])) if total else nan,
    }


def draw_reliability(ax: Any, stats: Mapping[str, Any], legend: bool = True) -> None:
    """Reliability bars on `ax`: accuracy per confidence bin (solid bars), the gap to the
    bin's mean confidence (red hatching, no fill, so a bar keeps its colour and the legend
    swatch looks like what is drawn), the mean confidence (black tick) and the diagonal."""
    from matplotlib.patches import Patch

    nonempty = stats["nonempty"]
    edges = stats["edges"]
    left = edges[:-1][nonempty]
    width = np.diff(edges)[nonempty]
    acc = stats["accuracy"][nonempty]
    conf = stats["confidence"][nonempty]
    ax.bar(left, acc, width=width, align="edge", color="tab:blue", edgecolor="black", lw=0.5)
    ax.bar(
        left,
        np.abs(conf - acc),
        bottom=np.minimum(acc, conf),
        width=width,
        align="edge",
        facecolor="none",
        edgecolor="tab:red",
        hatch="///",
        lw=0.8,
    )
    ax.hlines(conf, left, left + width, colors="black", lw=1.5)
    ax.plot([0, 1], [0, 1], ls="--", color="gray", lw=1)
    ax.set_xlim(edges[0], edges[-1])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("confidence (max probability)")
    ax.set_ylabel("accuracy in bin")
    if legend:
        ax.legend(
            handles=[
                Patch(facecolor="tab:blue", edgecolor="black", label="accuracy"),
                Patch(facecolor="none", edgecolor="tab:red", hatch="///", label="gap to conf."),
                ax.plot([], [], color="black", lw=1.5, label="mean confidence")[0],
                ax.plot([], [], ls="--", color="gray", lw=1, label="perfect calibration")[0],
            ],
            loc="upper left",
        )


def reliability_figure(bins: Mapping[str, npt.NDArray[Any]], model: str, data: str) -> Any:
    """A reliability diagram of ``bins`` (the dict of ``metrics.reliability_bins``).

    Top panel: `draw_reliability` (accuracy bars, gap, mean confidence, diagonal); bottom
    panel: the fraction of examples per bin. Empty bins (NaN accuracy) are left blank. The
    title names `model` and `data` and states the ECE and accuracy.

    Shape:
        - bins: ``edges [B + 1]``, ``count [B]``, ``accuracy [B]``, ``confidence [B]``.
    """
    stats = reliability_stats(bins)

    def draw(fig: Any) -> None:
        ax, ax_count = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        draw_reliability(ax, stats)
        ax.set_xlabel("")
        ax.set_title(
            f"{wrap(model)}\non {data}: ECE {stats['ece']:.3f}, accuracy {stats['acc']:.3f}, "
            f"N = {int(stats['total'])}"
        )
        total = stats["total"]
        frac = stats["count"] / total if total > 0 else stats["count"]
        edges = stats["edges"]
        ax_count.bar(
            edges[:-1], frac, width=np.diff(edges), align="edge", color="gray", ec="black", lw=0.5
        )
        ax_count.set_xlabel("confidence (max probability)")
        ax_count.set_ylabel("share of examples")

    with styled() as plt:
        fig = plt.figure(figsize=(5.6, 5.4), layout="constrained")
        return drawn(draw, plt, fig)


def save_reliability_diagram(
    bins: Mapping[str, npt.NDArray[Any]], path: Path, model: str, data: str
) -> None:
    """Write `reliability_figure(bins, model, data)` as a PNG at `path`."""
    save_figure(reliability_figure(bins, model, data), path)


def auroc(in_scores: npt.NDArray[Any], ood_scores: npt.NDArray[Any]) -> float:
    """OOD AUROC of the finite scores (OOD = positive, higher = more OOD); NaN if a side is
    empty. Shape: [N_in], [N_ood] -> scalar."""
    from uqcompress.uq.metrics import ood_detection

    base, other = finite(in_scores), finite(ood_scores)
    if not base.size or not other.size:
        return float("nan")
    return float(ood_detection(base, other)["auroc"])


def draw_ood(
    ax: Any,
    name: str,
    base: npt.NDArray[Any],
    sets: Mapping[str, npt.NDArray[Any]],
    in_label: str = "in-distribution",
) -> dict[str, float]:
    """Density histograms on `ax` of score `name`: the in-distribution scores `base`
    (filled) and each OOD set of `sets` (outlined, its AUROC against `base` in the legend),
    on shared bin edges. Returns each set's AUROC.

    Shape:
        - base: ``[N_in]``; sets: ``set -> [N_set]``.
    """
    base = finite(base)
    cleaned = {set_name: finite(values) for set_name, values in sets.items()}
    pooled = np.concatenate([base, *cleaned.values()])
    edges = np.histogram_bin_edges(pooled if pooled.size else np.zeros(1), bins=30)
    aurocs: dict[str, float] = {}
    if base.size:
        ax.hist(
            base,
            bins=edges,
            density=True,
            alpha=0.45,
            color="tab:blue",
            label=f"{in_label} (n={base.size})",
        )
    for set_name, values in cleaned.items():
        if values.size:
            aurocs[set_name] = auroc(base, values)
            ax.hist(
                values,
                bins=edges,
                density=True,
                histtype="step",
                lw=1.5,
                label=f"{set_name} (n={values.size}, AUROC {aurocs[set_name]:.3f})",
            )
    ax.set_xlabel(SCORE_LABELS.get(name, name))
    ax.set_ylabel("density")
    ax.legend()
    return aurocs


def ood_figure(
    in_scores: Mapping[str, npt.NDArray[Any]],
    ood_scores: Mapping[str, Mapping[str, npt.NDArray[Any]]],
    model: str,
    data: str,
) -> Any:
    """Overlaid density histograms of in-distribution vs OOD uncertainty scores.

    One panel per score name in ``in_scores`` (e.g. ``msp``, ``entropy`` and, for
    ensembles, ``mi``), in its order, each drawn by `draw_ood` (every OOD set that has the
    score, with its AUROC in the legend). Non-finite values are dropped. The title names
    `model` and `data` and states each set's AUROC by predictive entropy.

    Shape:
        - in_scores: ``name -> [N_in]``; ood_scores: ``set -> name -> [N_set]``.
    """
    if not in_scores:
        raise ValueError("in_scores is empty; expected e.g. {'msp': ..., 'entropy': ...}")
    names = list(in_scores)

    def draw(fig: Any) -> None:
        axes = fig.subplots(1, len(names), squeeze=False)[0]
        headline: dict[str, float] = {}
        for ax, name in zip(axes, names, strict=True):
            sets = {s: scores[name] for s, scores in ood_scores.items() if name in scores}
            aurocs = draw_ood(ax, name, in_scores[name], sets, in_label=data)
            ax.set_title(f"score: {name}")
            if name == HEADLINE_SCORE or not headline:
                headline = aurocs
        stated = ", ".join(f"{s} {v:.3f}" for s, v in headline.items()) or "no OOD scores"
        fig.suptitle(f"{wrap(model, 80)}: {data} vs OOD; AUROC by entropy: {stated}")

    with styled() as plt:
        fig = plt.figure(figsize=(4.6 * len(names), 4.0), layout="constrained")
        return drawn(draw, plt, fig)


def save_ood_histograms(
    in_scores: Mapping[str, npt.NDArray[Any]],
    ood_scores: Mapping[str, Mapping[str, npt.NDArray[Any]]],
    path: Path,
    model: str,
    data: str,
) -> None:
    """Write `ood_figure(in_scores, ood_scores, model, data)` as a PNG at `path`."""
    save_figure(ood_figure(in_scores, ood_scores, model, data), path)


def _history_panels(history: list[Mapping[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(panel title, y label, history keys drawn in it): the loss (train and validation),
    one panel per other validation metric, one per other number an epoch recorded (e.g. a
    distillation loss), and the learning rate."""
    first = history[0]
    numbers = [k for k, v in first.items() if isinstance(v, int | float) and k not in _TRAIN_KEYS]
    panels = [("loss", "loss", ["train_loss"] + (["val_loss"] if "val_loss" in first else []))]
    for key in numbers:
        name = key.removeprefix("val_")
        title = f"validation {name}" if key.startswith("val_") else key.replace("_", " ")
        panels.append((title, _METRIC_LABELS.get(name, name.replace("_", " ")), [key]))
    panels.sort(key=lambda panel: not panel[2][0].startswith(("train_", "val_")))
    return [*panels, ("learning rate at epoch end", "learning rate", ["lr"])]


def _headline(history: list[Mapping[str, Any]], best_epoch: int | None) -> str:
    """What the kept weights scored: the kept (or last) epoch's validation accuracy and NLL,
    else its training loss."""
    epoch = best_epoch if best_epoch is not None else int(history[-1]["epoch"])
    row = next((r for r in history if int(r["epoch"]) == epoch), history[-1])
    kept = f"kept epoch {epoch}" if best_epoch is not None else f"last epoch {epoch}"
    shown = [f"val {k[4:]} {row[k]:.3f}" for k in ("val_acc", "val_nll") if k in row]
    return f"{kept}: " + (", ".join(shown) if shown else f"train loss {row['train_loss']:.3f}")


def history_figure(
    history: list[Mapping[str, Any]],
    model: str,
    step: str,
    data: str,
    best_epoch: int | None = None,
) -> Any:
    """A training run's curves, one panel per metric over integer epoch ticks: the loss
    (train, and validation where present), each other validation metric, each other number
    an epoch recorded, and the learning rate at each epoch's end. `best_epoch` (1-based, the
    weights kept) is a dashed line in every panel. The title names `model`, the `step` and
    its training `data` and states the kept epoch's validation accuracy and NLL.

    Shape:
        - history: one mapping per epoch with `epoch`, `train_loss`, `lr` and `val_*` floats.
    """
    if not history:
        raise ValueError("history is empty; expected one row per epoch")
    from matplotlib.ticker import MaxNLocator

    epochs = [int(row["epoch"]) for row in history]
    panels = _history_panels(history)
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)

    def draw(fig: Any) -> None:
        axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
        for ax, (title, ylabel, keys) in zip(axes, panels, strict=False):
            for key in keys:
                label = "train" if key == "train_loss" else "validation"
                ax.plot(epochs, [row[key] for row in history], marker="o", ms=3, label=label)
            ax.set_title(title)
            ax.set_ylabel(ylabel)
            if len(keys) > 1:
                ax.legend()
            ax.set_xlabel("epoch")
            if len(epochs) <= 12:  # every epoch a tick (one epoch would get 0.95, 1.0, ...)
                ax.set_xticks(epochs)
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if best_epoch is not None:
                ax.axvline(best_epoch, ls="--", color="tab:red", lw=1)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        kept = " (red dashed line: the epoch kept)" if best_epoch is not None else ""
        fig.suptitle(f"{wrap(model, 80)}: {step} on {data}\n{_headline(history, best_epoch)}{kept}")

    with styled() as plt:
        fig = plt.figure(figsize=(4.2 * cols, 3.2 * rows + 0.6), layout="constrained")
        return drawn(draw, plt, fig)


def save_training_curves(
    history: list[Mapping[str, Any]],
    path: Path,
    model: str,
    step: str,
    data: str,
    best_epoch: int | None = None,
) -> None:
    """Write `history_figure(history, model, step, data, best_epoch)` as a PNG at `path`."""
    save_figure(history_figure(history, model, step, data, best_epoch), path)
