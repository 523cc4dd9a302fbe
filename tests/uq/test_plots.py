"""Tests for uqcompress.uq.plots: each function writes a real PNG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uqcompress.uq.metrics import reliability_bins, uncertainty_scores
from uqcompress.uq.plots import save_ood_histograms, save_reliability_diagram

PNG_SIGNATURE = b"\x89PNG"


def _assert_png(path: Path) -> None:
    assert path.is_file()
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 5_000


def test_reliability_diagram_writes_png(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(4, 0.5), size=300)
    labels = rng.integers(0, 4, size=300)
    bins = reliability_bins(probs, labels, n_bins=15)
    out = tmp_path / "nested" / "reliability.png"
    save_reliability_diagram(bins, out, "random dirichlet")
    _assert_png(out)


def test_reliability_diagram_with_empty_bins(tmp_path: Path) -> None:
    probs = np.array([[0.95, 0.05], [0.9, 0.1], [0.55, 0.45], [0.6, 0.4]])
    bins = reliability_bins(probs, np.array([0, 1, 0, 1]), n_bins=10)
    assert np.isnan(bins["accuracy"]).any()
    out = tmp_path / "sparse.png"
    save_reliability_diagram(bins, out, "mostly empty bins")
    _assert_png(out)


def test_reliability_diagram_rejects_bad_bins(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing keys"):
        save_reliability_diagram({"edges": np.linspace(0, 1, 3)}, tmp_path / "x.png", "bad")
    assert not (tmp_path / "x.png").exists()


def _scores(m: int, alpha: float, n: int, seed: int) -> dict[str, np.ndarray]:
    probs = np.random.default_rng(seed).dirichlet(np.full(5, alpha), size=(n, m))
    return uncertainty_scores(probs)


@pytest.mark.parametrize("m", [3, 1])
def test_ood_histograms_writes_png(tmp_path: Path, m: int) -> None:
    in_scores = _scores(m, 0.2, 200, seed=1)
    assert ("mi" in in_scores) == (m > 1)
    ood = {"shifted": _scores(m, 1.0, 150, seed=2), "noise": _scores(m, 5.0, 80, seed=3)}
    out = tmp_path / f"ood_m{m}.png"
    save_ood_histograms(in_scores, ood, out, f"OOD scores, M = {m}")
    _assert_png(out)


def test_ood_histograms_constant_scores_and_missing_set_score(tmp_path: Path) -> None:
    in_scores = {"msp": np.zeros(10), "entropy": np.full(10, 0.3)}
    ood = {"other": {"msp": np.full(5, 0.5)}}  # no "entropy" in this set
    out = tmp_path / "const.png"
    save_ood_histograms(in_scores, ood, out, "degenerate")
    _assert_png(out)


def test_ood_histograms_rejects_empty(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="in_scores is empty"):
        save_ood_histograms({}, {}, tmp_path / "x.png", "empty")


def test_plots_module_import_is_cheap() -> None:
    code = (
        "import sys; import uqcompress.uq.plots; "
        "sys.exit(1 if 'matplotlib' in sys.modules or 'torch' in sys.modules else 0)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
