"""uqcompress.uq.compare_plot: the comparison is a grid of legible panels drawn from the
models' numbers (headline bars, a reliability diagram and OOD histograms per model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.uq.test_plots import assert_legible, assert_png, close, texts
from uqcompress.uq.compare_plot import ComparedModel, comparison_figure, save_comparison
from uqcompress.uq.metrics import ood_detection, reliability_bins


def _models(n: int, with_ood: bool = True) -> list[ComparedModel]:
    rng = np.random.default_rng(0)
    models = []
    for i in range(n):
        probs = rng.dirichlet(np.full(3, 0.4), size=120)
        bins = reliability_bins(probs, rng.integers(0, 3, size=120), n_bins=10)
        metrics = {"acc": 0.9 + i / 100, "ece": 0.05, "latency_ms": 0.1 * (i + 1)}
        in_entropy = rng.gamma(1.0, 0.1, 120)
        ood = {"noise": rng.gamma(3.0, 0.3, 60)} if with_ood else {}
        if with_ood:
            metrics["ood.noise.entropy.auroc"] = ood_detection(in_entropy, ood["noise"])["auroc"]
        name = f"model {i} with a long descriptive name, + 10 epochs fine-tuning"
        models.append(ComparedModel(name, metrics, bins, in_entropy, ood))
    return models


def test_comparison_grid_is_legible_and_states_each_model(tmp_path: Path) -> None:
    models = _models(5)
    fig = comparison_figure(models, "digits@test")
    try:
        shown = [ax for ax in fig.axes if ax.get_visible()]
        summary = [ax for ax in shown if ax.get_xlabel().endswith("is better)")]
        assert [ax.get_xlabel().split(" (")[0] for ax in summary] == [
            "accuracy",
            "ECE",
            "OOD AUROC vs noise",
            "ms / example, model only",
        ]
        ticks = [t.get_text().replace("\n", " ") for t in summary[0].get_yticklabels()]
        assert ticks == [m.name for m in models]
        bar_values = sorted(round(p.get_width(), 6) for p in summary[0].patches)
        assert bar_values == sorted(round(m.metrics["acc"], 6) for m in models)
        per_model = [ax for ax in shown if ax not in summary]
        assert len(per_model) == 2 * len(models)  # reliability + OOD histograms each
        all_text = " ".join(t.get_text() for t in texts(fig))
        assert "5 models on digits@test" in all_text
        auroc = models[2].metrics["ood.noise.entropy.auroc"]
        assert f"AUROC {auroc:.3f}" in all_text
        assert_legible(fig)
    finally:
        close(fig)
    out = tmp_path / "comparison.png"
    save_comparison(models, "digits@test", out)
    assert_png(out, 1600, 1500)


def test_comparison_without_ood_or_recorded_scores(tmp_path: Path) -> None:
    models = _models(2, with_ood=False)
    models.append(ComparedModel("an old eval", {"acc": 0.8, "ece": 0.1}))
    fig = comparison_figure(models, "d")
    try:
        summary = [ax for ax in fig.axes if ax.get_xlabel().endswith("is better)")]
        assert len(summary) == 3  # no OOD panel without an OOD set
        titles = " ".join(ax.get_title() for ax in fig.axes)
        assert "an old eval\nno reliability bins recorded" in titles
        assert_legible(fig)
    finally:
        close(fig)
    save_comparison(models, "d", tmp_path / "c.png")
    assert_png(tmp_path / "c.png", 1600, 400)
