"""Tests for uqcompress.uq.metrics: analytic cases and agreement with scikit-learn."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, brier_score_loss, log_loss

from uqcompress.uq.metrics import (
    accuracy,
    brier,
    classification_metrics,
    ece,
    ece_change,
    nll,
    reliability_bins,
)

SKLEARN_BRIER_MULTICLASS = "scale_by_half" in inspect.signature(brier_score_loss).parameters


def _random_problem(n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(c, 0.7), size=n)
    labels = rng.integers(0, c, size=n)
    return probs, labels


# --------------------------------------------------------------------------- sklearn parity


@pytest.mark.parametrize(("n", "c", "seed"), [(200, 2, 0), (300, 5, 1), (57, 10, 2)])
def test_accuracy_matches_sklearn(n: int, c: int, seed: int) -> None:
    probs, labels = _random_problem(n, c, seed)
    expected = accuracy_score(labels, probs.argmax(axis=1))
    assert 0.0 < expected < 1.0
    assert accuracy(probs, labels) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(("n", "c", "seed"), [(200, 2, 3), (300, 5, 4), (57, 10, 5)])
def test_nll_matches_sklearn_log_loss(n: int, c: int, seed: int) -> None:
    probs, labels = _random_problem(n, c, seed)
    expected = log_loss(labels, probs, labels=list(range(c)))
    assert nll(probs, labels) == pytest.approx(expected, rel=1e-10)


def test_nll_hand_computed_and_clipped() -> None:
    probs = np.array([[0.5, 0.5], [0.9, 0.1], [1.0, 0.0]])
    labels = np.array([0, 1, 1])
    expected = -(math.log(0.5) + math.log(0.1) + math.log(1e-12)) / 3
    assert nll(probs, labels) == pytest.approx(expected, rel=1e-12)
    assert nll(probs, labels, eps=1e-6) == pytest.approx(
        -(math.log(0.5) + math.log(0.1) + math.log(1e-6)) / 3, rel=1e-12
    )


@pytest.mark.parametrize("seed", [6, 7])
def test_brier_binary_is_twice_sklearn(seed: int) -> None:
    probs, labels = _random_problem(250, 2, seed)
    expected = 2.0 * brier_score_loss(labels, probs[:, 1])
    assert brier(probs, labels) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "seed"), [(300, 3, 8), (120, 7, 9)])
def test_brier_multiclass_matches_onehot_numpy(n: int, c: int, seed: int) -> None:
    probs, labels = _random_problem(n, c, seed)
    onehot = np.eye(c)[labels]
    expected = float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))
    assert brier(probs, labels) == pytest.approx(expected, rel=1e-12)


@pytest.mark.skipif(
    not SKLEARN_BRIER_MULTICLASS, reason="scikit-learn < 1.7: no multi-class brier_score_loss"
)
@pytest.mark.parametrize(("n", "c", "seed"), [(300, 3, 10), (120, 7, 11), (100, 2, 12)])
def test_brier_multiclass_matches_sklearn(n: int, c: int, seed: int) -> None:
    probs, labels = _random_problem(n, c, seed)
    expected = brier_score_loss(labels, probs, labels=list(range(c)), scale_by_half=False)
    assert brier(probs, labels) == pytest.approx(expected, rel=1e-12)


def test_brier_extremes() -> None:
    labels = np.array([0, 1, 2])
    assert brier(np.eye(3), labels) == 0.0
    assert brier(np.eye(3)[[1, 2, 0]], labels) == pytest.approx(2.0, abs=1e-15)


# --------------------------------------------------------------------------- ECE and bins


def test_ece_perfectly_calibrated_is_zero() -> None:
    probs = np.tile([0.8, 0.2], (10, 1))
    labels = np.array([0] * 8 + [1] * 2)  # 80% correct at confidence 0.8
    assert ece(probs, labels) == pytest.approx(0.0, abs=1e-12)
    bins = reliability_bins(probs, labels)
    assert bins["count"].sum() == 10
    assert np.count_nonzero(bins["count"]) == 1


def test_ece_hand_computed_two_bins() -> None:
    # 4 examples at confidence 0.9 with 3 correct (acc 0.75, gap 0.15),
    # 6 examples at confidence 0.6 with 3 correct (acc 0.5, gap 0.10).
    hi = np.tile([0.9, 0.05, 0.05], (4, 1))
    lo = np.tile([0.6, 0.3, 0.1], (6, 1))
    probs = np.vstack([hi, lo])
    labels = np.array([0, 0, 0, 1, *[0, 0, 0, 2, 2, 1]])  # hi block, then lo block
    expected = 0.4 * 0.15 + 0.6 * 0.10
    assert ece(probs, labels, n_bins=10) == pytest.approx(expected, abs=1e-12)

    bins = reliability_bins(probs, labels, n_bins=10)
    count = bins["count"]
    assert count[9] == 4 and count[6] == 6 and count.sum() == 10
    assert bins["accuracy"][9] == pytest.approx(0.75)
    assert bins["accuracy"][6] == pytest.approx(0.5)
    assert bins["confidence"][9] == pytest.approx(0.9)
    assert bins["confidence"][6] == pytest.approx(0.6)


def test_reliability_bins_layout_and_empty_bins_are_nan() -> None:
    probs, labels = _random_problem(40, 3, 13)
    bins = reliability_bins(probs, labels, n_bins=15)
    assert set(bins) == {"edges", "count", "accuracy", "confidence"}
    np.testing.assert_allclose(bins["edges"], np.linspace(0.0, 1.0, 16), atol=1e-15)
    assert bins["count"].shape == bins["accuracy"].shape == bins["confidence"].shape == (15,)
    empty = bins["count"] == 0
    assert empty[:4].all()  # max prob of a 3-class distribution is >= 1/3
    assert np.isnan(bins["accuracy"][empty]).all() and np.isnan(bins["confidence"][empty]).all()
    assert not np.isnan(bins["accuracy"][~empty]).any()
    # Mean confidence of each non-empty bin lies inside the bin.
    e = bins["edges"]
    conf = bins["confidence"]
    for b in np.flatnonzero(~empty):
        assert e[b] <= conf[b] <= e[b + 1]


def test_confidence_one_falls_in_last_bin() -> None:
    probs = np.array([[1.0, 0.0], [0.0, 1.0], [0.55, 0.45]])
    labels = np.array([0, 0, 0])
    bins = reliability_bins(probs, labels, n_bins=15)
    assert bins["count"][-1] == 2
    assert bins["count"][8] == 1  # floor(0.55 * 15) = 8
    assert bins["count"].sum() == 3
    assert bins["accuracy"][-1] == pytest.approx(0.5)
    # last bin: |0.5 - 1.0| * 2/3; bin 8: |1 - 0.55| * 1/3
    assert ece(probs, labels) == pytest.approx(0.5 * 2 / 3 + 0.45 / 3, abs=1e-12)


def test_confidence_on_inner_edge_goes_to_upper_bin() -> None:
    probs = np.array([[0.8, 0.2], [0.6, 0.4]])
    labels = np.array([0, 0])
    bins = reliability_bins(probs, labels, n_bins=5)
    np.testing.assert_array_equal(bins["count"], [0, 0, 0, 1, 1])
    # 15/22 * 22 rounds to 14.999..., yet 15/22 sits exactly on edge 15 -> bin 15.
    k, n = 15, 22
    assert math.floor((k / n) * n) == k - 1
    edge = np.array([[k / n, 1 - k / n]])
    bins = reliability_bins(edge, np.array([0]), n_bins=n)
    assert bins["count"][k] == 1 and bins["count"].sum() == 1


def test_ece_of_always_wrong_model_is_mean_confidence() -> None:
    rng = np.random.default_rng(14)
    conf = rng.uniform(0.5, 1.0, size=500)
    probs = np.stack([conf, 1.0 - conf], axis=1)
    labels = np.ones(500, dtype=np.int64)
    probs[conf == 0.5] = [0.75, 0.25]  # keep argmax unambiguous (class 0)
    assert accuracy(probs, labels) == 0.0
    assert ece(probs, labels) == pytest.approx(float(probs.max(axis=1).mean()), rel=1e-12)
    assert ece(probs, labels, n_bins=1) == pytest.approx(float(probs.max(axis=1).mean()))


def test_ece_equals_weighted_gap_from_bins_on_random_data() -> None:
    probs, labels = _random_problem(1000, 4, 15)
    bins = reliability_bins(probs, labels, n_bins=10)
    ok = bins["count"] > 0
    expected = np.sum(bins["count"][ok] / 1000 * np.abs(bins["accuracy"] - bins["confidence"])[ok])
    value = ece(probs, labels, n_bins=10)
    assert value == pytest.approx(expected, rel=1e-12)
    assert 0.0 < value < 1.0
    # Brute-force reference with the documented rule.
    c = probs.max(axis=1)
    idx = np.minimum(np.floor(c * 10).astype(int), 9)
    correct = probs.argmax(axis=1) == labels
    ref = sum(
        (idx == b).mean() * abs(correct[idx == b].mean() - c[idx == b].mean())
        for b in range(10)
        if (idx == b).any()
    )
    assert value == pytest.approx(ref, rel=1e-12)


def _two_class(conf: np.ndarray) -> np.ndarray:
    return np.stack([conf, 1.0 - conf], axis=1)


def test_ece_change_of_identical_models_is_zero_and_starts_from_ece() -> None:
    probs, labels = _random_problem(300, 4, 21)
    assert ece_change(probs, probs, labels) == 0.0
    # Rows that stay in their bins: the same number as the plain difference of the ECEs.
    sharper = probs**1.02 / np.sum(probs**1.02, axis=1, keepdims=True)
    same_bins = np.floor(probs.max(1) * 15) == np.floor(sharper.max(1) * 15)
    p0, p1, y = probs[same_bins], sharper[same_bins], labels[same_bins]
    assert ece_change(p0, p1, y) == pytest.approx(ece(p1, y) - ece(p0, y), abs=1e-12)


def test_ece_change_ignores_rows_crossing_a_bin_edge() -> None:
    # 20 rows just under the 0.8 edge (all correct) and 20 just above it (half correct): a
    # shift of 2e-6 moves the first 20 across the edge. The plain ECE difference jumps by
    # 0.05 though no prediction changed and no confidence moved by more than 2e-6.
    conf = np.array([0.8 - 1e-6] * 20 + [0.8 + 1e-6] * 20)
    labels = np.array([0] * 20 + [0, 1] * 10)
    before, after = _two_class(conf), _two_class(conf + 2e-6)
    assert abs(ece(after, labels) - ece(before, labels)) > 0.05
    assert abs(ece_change(before, after, labels)) <= 2e-6 + 1e-12


def test_ece_change_is_bounded_by_what_changed() -> None:
    rng = np.random.default_rng(5)
    for _ in range(20):
        before, labels = _random_problem(200, 3, int(rng.integers(1 << 30)))
        logits = np.log(before) + rng.normal(0.0, 0.05, before.shape)
        after = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        right0, right1 = before.argmax(1) == labels, after.argmax(1) == labels
        bound = np.mean(right0 != right1) + np.mean(np.abs(after.max(1) - before.max(1)))
        assert abs(ece_change(before, after, labels)) <= bound + 1e-12


def test_ece_change_sees_a_model_grown_overconfident() -> None:
    # Calibrated at 0.7 (70 of 100 right); the same predictions at 0.9 are 0.2 overconfident.
    labels = np.array([0] * 70 + [1] * 30)
    before, after = _two_class(np.full(100, 0.7)), _two_class(np.full(100, 0.9))
    assert ece(before, labels) == pytest.approx(0.0, abs=1e-12)
    assert ece_change(before, after, labels) == pytest.approx(0.2, abs=1e-12)


def test_ece_change_refuses_mismatched_shapes() -> None:
    probs, labels = _random_problem(10, 3, 0)
    fewer = probs[:, :2] / probs[:, :2].sum(1, keepdims=True)
    with pytest.raises(ValueError, match="same shape"):
        ece_change(probs, fewer, labels % 2)


# --------------------------------------------------------------------------- summary dict


def test_classification_metrics_keys_and_json() -> None:
    probs, labels = _random_problem(100, 3, 16)
    out = classification_metrics(probs, labels)
    assert list(out) == ["acc", "f1_macro", "mcc", "nll", "brier", "ece"]
    assert all(type(v) is float for v in out.values())
    assert out["acc"] == accuracy(probs, labels)
    assert out["nll"] == nll(probs, labels)
    assert out["brier"] == brier(probs, labels)
    assert out["ece"] == ece(probs, labels, n_bins=15)
    assert json.loads(json.dumps(out)) == out


def test_float32_and_list_inputs_accepted() -> None:
    probs, labels = _random_problem(50, 3, 17)
    ref = classification_metrics(probs, labels)
    got = classification_metrics(probs.astype(np.float32), labels.astype(np.int32))
    for key in ref:
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6)
    assert accuracy(probs.tolist(), labels.tolist()) == ref["acc"]


# --------------------------------------------------------------------------- validation


ALL_METRICS = [accuracy, nll, brier, ece, reliability_bins, classification_metrics]


@pytest.mark.parametrize("fn", ALL_METRICS)
def test_mismatched_n_raises(fn: Callable[..., object]) -> None:
    with pytest.raises(ValueError, match="disagree on N"):
        fn(np.full((3, 2), 0.5), np.array([0, 1]))


@pytest.mark.parametrize("fn", ALL_METRICS)
def test_empty_input_raises(fn: Callable[..., object]) -> None:
    with pytest.raises(ValueError, match="empty"):
        fn(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))


@pytest.mark.parametrize("fn", ALL_METRICS)
@pytest.mark.parametrize("bad", [[0, 2], [-1, 0]])
def test_labels_out_of_range_raise(fn: Callable[..., object], bad: list[int]) -> None:
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        fn(np.full((2, 2), 0.5), np.array(bad))


def test_other_invalid_inputs_raise() -> None:
    probs = np.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="2-D"):
        accuracy(np.array([0.5, 0.5]), np.array([0, 1]))
    with pytest.raises(ValueError, match="1-D"):
        accuracy(probs, np.array([[0], [1]]))
    with pytest.raises(ValueError, match="integer"):
        nll(probs, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="NaN"):
        brier(np.array([[np.nan, 0.5], [0.5, 0.5]]), np.array([0, 1]))
    with pytest.raises(ValueError, match="n_bins"):
        ece(probs, np.array([0, 1]), n_bins=0)
    with pytest.raises(ValueError, match="n_bins"):
        reliability_bins(probs, np.array([0, 1]), n_bins=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        nll(probs, np.array([0, 1]), eps=0.0)


def test_metrics_module_does_not_import_torch() -> None:
    code = "import sys; import uqcompress.uq.metrics; sys.exit(1 if 'torch' in sys.modules else 0)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr or "uqcompress.uq.metrics imported torch"


# --------------------------------------------------------------------------- F1, MCC, per class


@pytest.mark.parametrize("classes", [2, 3, 7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_macro_f1_and_mcc_match_scikit_learn(classes: int, seed: int) -> None:
    from sklearn.metrics import f1_score, matthews_corrcoef

    from uqcompress.uq.metrics import macro_f1
    from uqcompress.uq.metrics import matthews_corrcoef as mcc

    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(classes), size=60)
    labels = rng.integers(0, classes, size=60)
    labels[:20] = probs[:20].argmax(axis=1)  # better than chance, so the values are not ~0
    predicted = probs.argmax(axis=1)
    assert macro_f1(probs, labels) == pytest.approx(
        f1_score(labels, predicted, average="macro"), abs=1e-12
    )
    assert mcc(probs, labels) == pytest.approx(matthews_corrcoef(labels, predicted), abs=1e-12)


def test_mcc_is_zero_when_one_class_is_predicted_for_everything() -> None:
    from sklearn.metrics import matthews_corrcoef

    from uqcompress.uq.metrics import matthews_corrcoef as mcc

    probs = np.tile([0.9, 0.1], (6, 1))
    labels = np.array([0, 1, 0, 1, 1, 0])
    assert mcc(probs, labels) == 0.0 == matthews_corrcoef(labels, np.zeros(6, dtype=int))


def test_per_class_accuracy_is_each_class_recall() -> None:
    from uqcompress.uq.metrics import per_class_accuracy

    probs = np.eye(3)[[0, 0, 1, 2, 2, 2]]  # predictions 0 0 1 2 2 2
    labels = np.array([0, 1, 1, 2, 2, 0])
    assert per_class_accuracy(probs, labels) == [0.5, 0.5, 1.0]
    assert per_class_accuracy(np.eye(3)[[0, 1]], np.array([0, 1])) == [1.0, 1.0, None]


def test_ood_set_names_come_from_metric_keys_in_first_seen_order() -> None:
    from uqcompress.uq.metrics import ood_set_names

    metrics = [
        {"acc": 0.9, "ood.photos.entropy.auroc": 0.8, "ood.noise.msp.fpr95": 0.3},
        {"ood.noise.entropy.auroc": 0.7, "ood.text.entropy.aupr": 0.6, "ood.bad": 1.0},
    ]
    assert ood_set_names(metrics) == ["photos", "noise", "text"]
    assert ood_set_names([]) == []
