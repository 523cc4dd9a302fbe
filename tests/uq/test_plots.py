"""uqcompress.uq.plots: each plot drawn on tiny data is a real, non-blank PNG, and its
matplotlib objects say what a reader needs (model, data and headline number in the title,
labelled axes, a legend that names what is drawn, no text under 9 pt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uqcompress.uq.metrics import ece, ood_detection, reliability_bins, uncertainty_scores
from uqcompress.uq.plots import (
    MIN_FONT_PT,
    history_figure,
    ood_figure,
    reliability_figure,
    save_ood_histograms,
    save_reliability_diagram,
    save_training_curves,
)

PNG_SIGNATURE = b"\x89PNG"


def assert_png(path: Path, min_width: int, min_height: int) -> None:
    """A PNG of at least that size whose pixels are not one flat colour."""
    import matplotlib.image

    assert path.read_bytes().startswith(PNG_SIGNATURE)
    pixels = matplotlib.image.imread(str(path))[..., :3]
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, (width, height)
    ink = (pixels < 0.9).any(axis=-1).mean()  # share of pixels that are not near-white
    assert 0.03 < ink < 0.9, ink


def texts(fig: Any) -> list[Any]:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def assert_legible(fig: Any) -> None:
    small = [(t.get_text(), t.get_fontsize()) for t in texts(fig) if t.get_fontsize() < 9]
    assert not small, f"text under {MIN_FONT_PT} pt: {small[:5]}"


def close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _bins(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(4, 0.5), size=300)
    labels = rng.integers(0, 4, size=300)
    return reliability_bins(probs, labels, n_bins=15)


def test_reliability_diagram_states_model_data_and_ece(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(4, 0.5), size=300)
    labels = rng.integers(0, 4, size=300)
    bins = reliability_bins(probs, labels, n_bins=15)
    fig = reliability_figure(bins, "vit-small", "digits@test")
    try:
        top, bottom = fig.axes
        title = top.get_title()
        assert "vit-small" in title and "digits@test" in title
        assert f"ECE {ece(probs, labels, n_bins=15):.3f}" in title
        assert f"accuracy {np.mean(probs.argmax(1) == labels):.3f}" in title
        assert top.get_ylabel() == "accuracy in bin"
        assert bottom.get_xlabel() == "confidence (max probability)"
        assert bottom.get_ylabel() == "share of examples"
        legend = [t.get_text() for t in top.get_legend().get_texts()]
        assert legend == ["accuracy", "gap to conf.", "mean confidence", "perfect calibration"]
        # the gap is hatching without fill: an accuracy bar keeps its colour under it
        gap_bars = [p for p in top.patches if p.get_hatch() == "///"]
        assert gap_bars and all(p.get_facecolor()[3] == 0 for p in gap_bars)
        assert_legible(fig)
    finally:
        close(fig)
    out = tmp_path / "nested" / "reliability.png"
    save_reliability_diagram(bins, out, "vit-small", "digits@test")
    assert_png(out, 500, 500)


def test_reliability_bar_at_full_accuracy_reaches_one() -> None:
    """A bin where every prediction is right has a bar of height 1.0, whatever its mean
    confidence (the old overlay made it read as the confidence)."""
    probs = np.tile([0.75, 0.25], (20, 1))
    bins = reliability_bins(probs, np.zeros(20, dtype=int), n_bins=10)
    fig = reliability_figure(bins, "m", "d")
    try:
        solid = [p for p in fig.axes[0].patches if p.get_hatch() is None]
        assert max(p.get_height() for p in solid) == pytest.approx(1.0)
    finally:
        close(fig)


def test_reliability_diagram_with_empty_bins(tmp_path: Path) -> None:
    probs = np.array([[0.95, 0.05], [0.9, 0.1], [0.55, 0.45], [0.6, 0.4]])
    bins = reliability_bins(probs, np.array([0, 1, 0, 1]), n_bins=10)
    assert np.isnan(bins["accuracy"]).any()
    out = tmp_path / "sparse.png"
    save_reliability_diagram(bins, out, "m", "mostly empty bins")
    assert_png(out, 500, 500)


def test_reliability_diagram_rejects_bad_bins(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing keys"):
        save_reliability_diagram({"edges": np.linspace(0, 1, 3)}, tmp_path / "x.png", "m", "d")
    assert not (tmp_path / "x.png").exists()


def _scores(m: int, alpha: float, n: int, seed: int) -> dict[str, np.ndarray]:
    probs = np.random.default_rng(seed).dirichlet(np.full(5, alpha), size=(n, m))
    return uncertainty_scores(probs)


@pytest.mark.parametrize("m", [3, 1])
def test_ood_histograms_state_auroc_per_set(tmp_path: Path, m: int) -> None:
    in_scores = _scores(m, 0.2, 200, seed=1)
    assert ("mi" in in_scores) == (m > 1)
    ood = {"shifted": _scores(m, 1.0, 150, seed=2), "noise": _scores(m, 5.0, 80, seed=3)}
    fig = ood_figure(in_scores, ood, "hydra", "digits@test")
    try:
        assert len(fig.axes) == len(in_scores)
        title = fig._suptitle.get_text()
        expected = ood_detection(in_scores["entropy"], ood["shifted"]["entropy"])["auroc"]
        assert "hydra" in title and "digits@test" in title
        assert f"shifted {expected:.3f}" in title
        for ax, name in zip(fig.axes, in_scores, strict=True):
            assert ax.get_ylabel() == "density" and ax.get_xlabel()
            assert ax.get_title() == f"score: {name}"
            legend = [t.get_text() for t in ax.get_legend().get_texts()]
            auroc = ood_detection(in_scores[name], ood["noise"][name])["auroc"]
            assert legend[0] == "digits@test (n=200)"
            assert f"noise (n=80, AUROC {auroc:.3f})" in legend
        assert_legible(fig)
    finally:
        close(fig)
    out = tmp_path / f"ood_m{m}.png"
    save_ood_histograms(in_scores, ood, out, "hydra", "digits@test")
    assert_png(out, 400 * len(in_scores), 400)


def test_ood_histograms_constant_scores_and_missing_set_score(tmp_path: Path) -> None:
    in_scores = {"msp": np.zeros(10), "entropy": np.full(10, 0.3)}
    ood = {"other": {"msp": np.full(5, 0.5)}}  # no "entropy" in this set
    out = tmp_path / "const.png"
    save_ood_histograms(in_scores, ood, out, "m", "degenerate")
    assert_png(out, 800, 400)


def test_ood_histograms_rejects_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="in_scores is empty"):
        save_ood_histograms({}, {}, tmp_path / "x.png", "m", "d")


def _history(epochs: int, validated: bool = True) -> list[dict[str, Any]]:
    rows = []
    for e in range(1, epochs + 1):
        row: dict[str, Any] = {"epoch": e, "steps": 7 * e, "lr": 1e-3 / e, "train_loss": 1 / e}
        if validated:
            row.update({"val_loss": 1.1 / e, "val_acc": 0.5 + e / 100, "val_nll": 1.1 / e})
            row["val_ece"] = 0.1 / e
        rows.append(row)
    return rows


def test_history_has_a_panel_per_metric_and_integer_epochs(tmp_path: Path) -> None:
    history = _history(7)
    fig = history_figure(history, "vit-small", "finetune", "digits@train", best_epoch=5)
    try:
        shown = [ax for ax in fig.axes if ax.get_visible()]
        titles = [ax.get_title() for ax in shown]
        assert titles == [
            "loss",
            "validation acc",
            "validation nll",
            "validation ece",
            "learning rate at epoch end",
        ]
        assert [ax.get_ylabel() for ax in shown] == [
            "loss",
            "accuracy",
            "NLL (nats)",
            "ECE",
            "learning rate",
        ]
        for ax in shown:
            assert ax.get_xlabel() == "epoch"
            ticks = [t for t in ax.get_xticks() if 1 <= t <= 7]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
        suptitle = fig._suptitle.get_text()
        assert "vit-small" in suptitle and "finetune on digits@train" in suptitle
        assert f"kept epoch 5: val acc {history[4]['val_acc']:.3f}" in suptitle
        assert_legible(fig)
    finally:
        close(fig)
    out = tmp_path / "history.png"
    save_training_curves(history, out, "vit-small", "finetune", "digits@train", best_epoch=5)
    assert_png(out, 1000, 600)


@pytest.mark.parametrize("epochs", [1, 30])
def test_history_epoch_ticks_are_whole_epochs(epochs: int) -> None:
    fig = history_figure(_history(epochs), "m", "finetune", "d")
    try:
        for ax in (a for a in fig.axes if a.get_visible()):
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    finally:
        close(fig)


def test_history_without_validation_shows_other_epoch_numbers(tmp_path: Path) -> None:
    history = _history(3, validated=False)
    for row in history:
        row["distill_loss"] = 2.0 / row["epoch"]
    fig = history_figure(history, "teacher", "distill-director", "digits@train")
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
        assert titles == ["loss", "distill loss", "learning rate at epoch end"]
        assert "last epoch 3: train loss 0.333" in fig._suptitle.get_text()
    finally:
        close(fig)


def test_history_rejects_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="history is empty"):
        save_training_curves([], tmp_path / "x.png", "m", "finetune", "d")
    assert not (tmp_path / "x.png").exists()


def test_plots_module_import_is_cheap() -> None:
    code = (
        "import sys; import uqcompress.uq.plots, uqcompress.uq.compare_plot; "
        "sys.exit(1 if 'matplotlib' in sys.modules or 'torch' in sys.modules else 0)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
