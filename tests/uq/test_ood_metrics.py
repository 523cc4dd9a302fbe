"""Tests for the uncertainty / OOD metrics of uqcompress.uq.metrics (vs scikit-learn)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from uqcompress.uq.metrics import (
    aurc,
    disagreement,
    member_mutual_information,
    ood_detection,
    predictive_entropy,
    uncertainty_scores,
)


def _sklearn_ood(s_in: np.ndarray, s_out: np.ndarray) -> dict[str, float]:
    y = np.r_[np.zeros(len(s_in)), np.ones(len(s_out))]
    s = np.r_[s_in, s_out]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    return {
        "auroc": float(roc_auc_score(y, s)),
        "aupr": float(average_precision_score(y, s)),
        "fpr95": float(fpr[np.argmax(tpr >= 0.95)]),
    }


def _members(n: int, m: int, c: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(c, 0.5), size=(n, m))


# --------------------------------------------------------------------------- ood_detection


@pytest.mark.parametrize(
    ("n_in", "n_out", "shift", "decimals", "seed"),
    [
        (300, 200, 0.8, None, 0),  # continuous, no ties
        (300, 200, 0.8, 1, 1),  # heavy ties
        (57, 20, 0.3, 2, 2),  # tpr hits exactly 0.95 (19/20)
        (100, 100, -0.5, None, 3),  # worse than chance
        (40, 313, 1.5, 0, 4),  # very coarse ties, unbalanced
        (1, 1, 1.0, None, 5),
    ],
)
def test_ood_detection_matches_sklearn(
    n_in: int, n_out: int, shift: float, decimals: int | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    s_in = rng.normal(0.0, 1.0, n_in)
    s_out = rng.normal(shift, 1.0, n_out)
    if decimals is not None:
        s_in, s_out = np.round(s_in, decimals), np.round(s_out, decimals)
    got = ood_detection(s_in, s_out)
    expected = _sklearn_ood(s_in, s_out)
    assert set(got) == {"auroc", "aupr", "fpr95"}
    assert all(type(v) is float for v in got.values())
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key


def test_ood_detection_integer_scores_match_sklearn() -> None:
    rng = np.random.default_rng(6)
    s_in, s_out = rng.integers(0, 5, 80), rng.integers(2, 8, 60)
    got = ood_detection(s_in, s_out)
    for key, value in _sklearn_ood(s_in, s_out).items():
        assert got[key] == pytest.approx(value, abs=1e-12), key


def test_ood_detection_analytic_cases() -> None:
    s_in, s_out = np.array([0.1, 0.2, 0.3]), np.array([0.7, 0.8])
    assert ood_detection(s_in, s_out) == {"auroc": 1.0, "aupr": 1.0, "fpr95": 0.0}
    reversed_ = ood_detection(s_out, s_in)
    assert reversed_["auroc"] == 0.0
    assert reversed_["fpr95"] == 1.0
    const = ood_detection(np.full(4, 0.5), np.full(6, 0.5))
    assert const["auroc"] == 0.5
    assert const["fpr95"] == 1.0
    assert const["aupr"] == pytest.approx(0.6)  # prevalence: one threshold flags everything


def test_ood_detection_half_tie() -> None:
    # Pairs: (0 vs 1) out wins, (0 vs 0) tie, (1 vs 1) tie, (1 vs 0) in wins -> (1 + .5 + .5)/4
    got = ood_detection(np.array([0.0, 1.0]), np.array([1.0, 0.0]))
    assert got["auroc"] == pytest.approx(0.5)
    got = ood_detection(np.array([0.0, 1.0]), np.array([1.0, 2.0]))
    assert got["auroc"] == pytest.approx((1 + 1 + 0.5 + 1) / 4)


@pytest.mark.parametrize(
    ("s_in", "s_out", "match"),
    [
        (np.array([]), np.array([1.0]), "scores_in is empty"),
        (np.array([1.0]), np.array([]), "scores_out is empty"),
        (np.array([np.nan, 1.0]), np.array([1.0]), "NaN"),
        (np.array([1.0]), np.array([np.inf]), "NaN or infinite"),
        (np.ones((2, 2)), np.array([1.0]), "1-D"),
        (np.array(["a"]), np.array([1.0]), "real-valued"),
    ],
)
def test_ood_detection_invalid_inputs(s_in: np.ndarray, s_out: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ood_detection(s_in, s_out)


# --------------------------------------------------------------------------- entropy / MI


@pytest.mark.parametrize("c", [2, 3, 10])
def test_predictive_entropy_uniform_and_one_hot(c: int) -> None:
    probs = np.vstack([np.full(c, 1.0 / c), np.eye(c)[0]])
    h = predictive_entropy(probs)
    assert h.shape == (2,)
    assert h[0] == pytest.approx(math.log(c), rel=1e-12)
    assert h[1] == 0.0


def test_predictive_entropy_hand_computed() -> None:
    h = predictive_entropy(np.array([[0.5, 0.25, 0.25, 0.0]]))
    assert h[0] == pytest.approx(1.5 * math.log(2), rel=1e-12)
    assert np.all(np.isfinite(h))


def test_mutual_information_cases() -> None:
    rng = np.random.default_rng(0)
    single = rng.dirichlet(np.ones(4), size=(5, 1))
    identical = np.repeat(single, 3, axis=1)
    assert np.array_equal(member_mutual_information(single), np.zeros(5))
    np.testing.assert_allclose(member_mutual_information(identical), 0.0, atol=1e-12)
    assert np.all(member_mutual_information(identical) >= 0.0)
    confident = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1 - 1e-9, 1e-9], [1e-9, 1 - 1e-9]]])
    np.testing.assert_allclose(member_mutual_information(confident), math.log(2), atol=1e-7)


def test_mutual_information_bounds_and_identity() -> None:
    p = _members(50, 4, 6, seed=1)
    mi = member_mutual_information(p)
    assert mi.shape == (50,)
    assert np.all(mi >= 0.0)
    assert np.all(mi <= min(math.log(4), math.log(6)) + 1e-12)
    expected = predictive_entropy(p.mean(axis=1)) - np.mean(
        [predictive_entropy(p[:, m]) for m in range(4)], axis=0
    )
    np.testing.assert_allclose(mi, expected, atol=1e-12)


@pytest.mark.parametrize(("m", "keys"), [(1, {"msp", "entropy"}), (3, {"msp", "entropy", "mi"})])
def test_uncertainty_scores_keys_and_values(m: int, keys: set[str]) -> None:
    p = _members(20, m, 5, seed=m)
    scores = uncertainty_scores(p)
    assert set(scores) == keys
    mean = p.mean(axis=1)
    np.testing.assert_allclose(scores["msp"], 1.0 - mean.max(axis=1), atol=1e-15)
    np.testing.assert_allclose(scores["entropy"], predictive_entropy(mean), atol=1e-15)
    if m > 1:
        np.testing.assert_allclose(scores["mi"], member_mutual_information(p), atol=1e-15)
    for v in scores.values():
        assert v.shape == (20,)


def test_uncertainty_scores_direction() -> None:
    confident = np.array([[[0.98, 0.01, 0.01]]])
    uniform = np.full((1, 1, 3), 1 / 3)
    for key in ("msp", "entropy"):
        assert uncertainty_scores(uniform)[key][0] > uncertainty_scores(confident)[key][0]


# --------------------------------------------------------------------------- aurc


def test_aurc_hand_computed() -> None:
    # conf = [0.7, 0.8, 0.9, 0.6], predictions = [0, 1, 0, 1]. With all labels 0 the
    # predictions are [right, wrong, right, wrong]; by descending confidence (0.9, 0.8, 0.7,
    # 0.6) the errors are 0, 1, 0, 1 -> risks 0/1, 1/2, 1/3, 2/4 -> AURC = (4/3) / 4 = 1/3.
    probs = np.array([[0.7, 0.3], [0.2, 0.8], [0.9, 0.1], [0.4, 0.6]])
    assert aurc(probs, np.array([0, 0, 0, 0])) == pytest.approx(1 / 3, rel=1e-12)
    # Last example now right: errors 0, 1, 0, 0 -> risks 0, 1/2, 1/3, 1/4.
    expected = (0 + 1 / 2 + 1 / 3 + 1 / 4) / 4
    assert aurc(probs, np.array([0, 0, 0, 1])) == pytest.approx(expected, rel=1e-12)


def test_aurc_ties_are_one_threshold_group() -> None:
    # Equal confidence: one threshold accepts both, risk 1/2 at either position, in either
    # row order (the old stable sort gave 0.75 and 0.25).
    probs = np.full((2, 2), 0.5)  # argmax -> class 0, equal confidence
    assert aurc(probs, np.array([1, 0])) == pytest.approx(0.5, rel=1e-12)
    assert aurc(probs, np.array([0, 1])) == pytest.approx(0.5, rel=1e-12)


def test_aurc_hand_computed_with_ties() -> None:
    # conf 0.9, 0.9, 0.8, 0.6, 0.6, 0.6; errors (all labels 0) 0, 1, 0, 1, 0, 1.
    # Groups: {0.9: 2 rows, 1 error} risk 1/2 twice; {0.8} risk 1/3; {0.6: 3 rows, 2 errors}
    # risk 3/6 three times -> AURC = (1/2 + 1/2 + 1/3 + 1/2 * 3) / 6 = 17/36.
    conf = np.array([0.9, 0.9, 0.8, 0.6, 0.6, 0.6])
    wrong = np.array([0, 1, 0, 1, 0, 1], dtype=bool)
    probs = np.stack([np.where(wrong, 1 - conf, conf), np.where(wrong, conf, 1 - conf)], axis=1)
    labels = np.zeros(6, dtype=int)
    assert aurc(probs, labels) == pytest.approx(17 / 36, rel=1e-12)
    assert aurc(probs, labels) == pytest.approx(_aurc_reference(probs, labels), rel=1e-12)


def _aurc_reference(probs: np.ndarray, labels: np.ndarray, rest: np.ndarray | None = None) -> float:
    """Straight from the definition: each distinct confidence is a threshold; accepting every
    example at least that confident has the error rate of the accepted ones; each example
    weighs 1/N at its own threshold."""
    conf = -(1.0 - probs.max(axis=1) if rest is None else rest)  # higher = more confident
    errors = probs.argmax(axis=1) != labels
    total = 0.0
    for threshold in np.unique(conf):
        accepted = conf >= threshold
        total += np.sum(conf == threshold) * errors[accepted].mean()
    return float(total / len(labels))


def test_aurc_is_independent_of_row_order() -> None:
    from uqcompress.uq.metrics import confidence_residual, softmax

    rng = np.random.default_rng(7)
    n = 200
    # logit gaps up to 40: many float32 confidences are exactly 1.0
    logits = rng.normal(0.0, 15.0, (n, 1, 4)).astype(np.float32)
    probs = softmax(logits).mean(axis=1).astype(np.float32).astype(np.float64)
    labels = rng.integers(0, 4, n)
    assert np.sum(probs.max(axis=1) == 1.0) > 10  # ties at 1.0 in float32
    rest = confidence_residual(logits, probs.argmax(axis=1))
    expected = aurc(probs, labels, rest)
    assert expected == pytest.approx(_aurc_reference(probs, labels, rest), rel=1e-12)
    plain = aurc(probs, labels)  # ranked by float32-rounded probs, ties grouped
    assert plain == pytest.approx(_aurc_reference(probs, labels), rel=1e-12)
    for _ in range(10):
        order = rng.permutation(n)
        assert aurc(probs[order], labels[order]) == pytest.approx(plain, rel=1e-12)
        got = aurc(probs[order], labels[order], confidence_residual(logits[order]))
        assert got == pytest.approx(expected, rel=1e-12)


def test_confidence_residual_separates_saturated_confidences() -> None:
    from uqcompress.uq.metrics import confidence_residual

    logits = np.array([[[20.0, 0.0]], [[30.0, 0.0]], [[50.0, 0.0]]], dtype=np.float32)
    rest = confidence_residual(logits)
    assert rest[0] > rest[1] > rest[2] > 0  # float32 max prob is 1.0 for all three
    assert rest[2] == pytest.approx(np.exp(-50.0), rel=1e-9)


def test_aurc_extremes_and_perfect_ranking_minimum() -> None:
    rng = np.random.default_rng(3)
    n, n_err = 30, 9
    conf = np.sort(rng.uniform(0.55, 1.0, n))[::-1]  # descending, distinct
    probs = np.stack([conf, 1 - conf], axis=1)
    labels = np.zeros(n, dtype=int)
    assert aurc(probs, labels) == 0.0
    assert aurc(probs, np.ones(n, dtype=int)) == 1.0
    labels[-n_err:] = 1  # the least confident are wrong: perfect ranking
    best = aurc(probs, labels)
    analytic = sum((k - n + n_err) / k for k in range(n - n_err + 1, n + 1)) / n
    assert best == pytest.approx(analytic, rel=1e-12)
    for _ in range(20):
        assert aurc(probs, rng.permutation(labels)) >= best - 1e-15


def test_aurc_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="empty"):
        aurc(np.zeros((0, 2)), np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match="disagree on N"):
        aurc(np.full((2, 2), 0.5), np.array([0]))
    with pytest.raises(ValueError, match="NaN"):
        aurc(np.array([[np.nan, 1.0]]), np.array([0]))


# --------------------------------------------------------------------------- disagreement


def test_disagreement_hand_computed() -> None:
    p = np.array(
        [
            # ensemble mean [0.6, 0.4] -> class 0; member argmax 0, 0, 1 -> 1/3
            [[0.9, 0.1], [0.6, 0.4], [0.3, 0.7]],
            # all agree on class 1 -> 0
            [[0.2, 0.8], [0.1, 0.9], [0.4, 0.6]],
        ]
    )
    assert disagreement(p) == pytest.approx((1 / 3 + 0) / 2)


def test_disagreement_mean_favours_unpicked_class() -> None:
    p = np.array([[[0.5, 0.05, 0.45], [0.05, 0.5, 0.45]]])  # mean argmax = class 2
    assert disagreement(p) == 1.0


def test_disagreement_identical_and_single_member() -> None:
    single = _members(10, 1, 4, seed=7)
    assert disagreement(single) == 0.0
    assert disagreement(np.repeat(single, 5, axis=1)) == 0.0
    assert type(disagreement(_members(10, 3, 4, seed=8))) is float


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("fn", [member_mutual_information, uncertainty_scores, disagreement])
def test_member_functions_invalid_inputs(fn: Callable[[np.ndarray], object]) -> None:
    with pytest.raises(ValueError, match="3-D"):
        fn(np.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="empty"):
        fn(np.zeros((0, 2, 2)))
    with pytest.raises(ValueError, match="empty axis"):
        fn(np.zeros((2, 0, 2)))
    with pytest.raises(ValueError, match="NaN"):
        fn(np.array([[[np.nan, 1.0]]]))


def test_predictive_entropy_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="2-D"):
        predictive_entropy(np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="empty"):
        predictive_entropy(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="NaN"):
        predictive_entropy(np.array([[np.inf, 0.0]]))
    with pytest.raises(ValueError, match="real-valued"):
        predictive_entropy(np.array([["a", "b"]]))
