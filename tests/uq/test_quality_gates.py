"""Quality gates: parsing, the metric names they accept, verdicts, and `uqc eval --gate`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.artifacts import open_artifact
from uqcompress.errors import ConfigError
from uqcompress.uq.quality_gates import (
    Bound,
    describe_failures,
    evaluate_gate,
    known_metrics,
    parse_gate,
)

KNOWN = known_metrics(["photo-patches"], 1)


# --------------------------------------------------------------------------- parse_gate


def test_parse_valid_expression_with_spaces() -> None:
    bounds = parse_gate("  acc >= 0.9 ,ece<=0.05,  nll <  1.5  ", KNOWN)
    assert bounds == [
        Bound("acc", ">=", 0.9),
        Bound("ece", "<=", 0.05),
        Bound("nll", "<", 1.5),
    ]


def test_parse_scientific_notation_and_signs() -> None:
    bounds = parse_gate("ece<=5e-2,brier<1E-3,aurc<2.5e+1,acc>-1,nll<.5", KNOWN)
    assert [b.value for b in bounds] == [0.05, 0.001, 25.0, -1.0, 0.5]


@pytest.mark.parametrize(
    ("op", "value", "passes", "fails"),
    [
        (">=", 0.5, [0.5, 0.6], [0.49]),
        ("<=", 0.5, [0.5, 0.4], [0.51]),
        (">", 0.5, [0.51], [0.5, 0.4]),
        ("<", 0.5, [0.49], [0.5, 0.6]),
    ],
)
def test_all_four_operators(op: str, value: float, passes: list[float], fails: list[float]) -> None:
    (bound,) = parse_gate(f"acc{op}{value}", KNOWN)
    assert bound.op == op and bound.value == value and bound.metric == "acc"
    assert all(bound.holds(v) for v in passes)
    assert not any(bound.holds(v) for v in fails)
    assert not bound.holds(math.nan)


@pytest.mark.parametrize(
    "expression",
    ["acc=>0.9", "acc>>1", "acc>=", ">=0.9", "acc 0.9", "acc>=0.9x", "acc>=1e", "acc==1"],
)
def test_unparsable_clause_is_a_config_error(expression: str) -> None:
    with pytest.raises(ConfigError, match="cannot parse"):
        parse_gate(expression, KNOWN)


@pytest.mark.parametrize("expression", ["", "acc>=0.9,,ece<=0.1", "acc>=0.9,", " , "])
def test_empty_clause_is_a_config_error(expression: str) -> None:
    with pytest.raises(ConfigError, match="cannot parse"):
        parse_gate(expression, KNOWN)


def test_unknown_metric_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown metric 'bogus'"):
        parse_gate("acc>=0.5,bogus>=1", KNOWN)
    # A near miss of an OOD key suggests the real ones.
    with pytest.raises(ConfigError, match=r"ood\.photo-patches\.msp\.auroc"):
        parse_gate("ood.photos.msp.auroc>=0.8", KNOWN)
    # Ensemble-only metrics do not exist for a single model.
    with pytest.raises(ConfigError, match="unknown metric"):
        parse_gate("disagreement<=0.1", KNOWN)
    with pytest.raises(ConfigError, match="unknown metric"):
        parse_gate("ood.photo-patches.mi.auroc>=0.6", KNOWN)


def test_known_metrics_for_ood_sets_and_members() -> None:
    single = set(known_metrics(["photo-patches", "reviews"], 1))
    assert {"acc", "nll", "brier", "ece", "aurc"} <= single
    for name in ("photo-patches", "reviews"):
        for score in ("msp", "entropy"):
            for key in ("auroc", "aupr", "fpr95"):
                assert f"ood.{name}.{score}.{key}" in single
    assert "disagreement" not in single
    assert not any(".mi." in k or k == "mi" for k in single)
    assert not any(k.startswith("ood.other.") for k in single)
    assert len([k for k in single if k.startswith("ood.")]) == 2 * 2 * 3

    ensemble = set(known_metrics(["photo-patches"], 3))
    assert "disagreement" in ensemble
    assert {f"ood.photo-patches.mi.{k}" for k in ("auroc", "aupr", "fpr95")} <= ensemble
    assert len([k for k in ensemble if k.startswith("ood.")]) == 3 * 3
    assert not any(k.startswith("ood.") for k in known_metrics([], 2))


# --------------------------------------------------------------------------- evaluate_gate


def test_evaluate_gate_passes_and_fails() -> None:
    bounds = parse_gate("acc>=0.9,ece<=0.05,nll<0.3", KNOWN)
    passing = evaluate_gate(bounds, {"acc": 0.95, "ece": 0.05, "nll": 0.2, "brier": 0.1})
    assert passing["passed"] is True
    assert passing["failures"] == []
    assert passing["expression"] == "acc>=0.9,ece<=0.05,nll<0.3"

    failing = evaluate_gate(bounds, {"acc": 0.85, "ece": 0.07, "nll": 0.2})
    assert failing["passed"] is False
    assert failing["failures"] == [
        {"metric": "acc", "value": 0.85, "bound": "acc>=0.9"},
        {"metric": "ece", "value": 0.07, "bound": "ece<=0.05"},
    ]
    text = describe_failures(failing)
    assert "acc = 0.85 fails acc>=0.9" in text and "ece = 0.07 fails ece<=0.05" in text

    nan = evaluate_gate(parse_gate("nll<1", KNOWN), {"nll": float("nan")})
    assert nan["passed"] is False


# --------------------------------------------------------------------------- uqc eval --gate


def _artifacts_empty() -> bool:
    root = Path(os.environ["UQC_ARTIFACTS"])
    return not root.exists() or not any(root.iterdir())


def test_eval_gate_that_holds_exits_0(
    cli: Callable[..., Any], trained_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    result = cli(
        "eval", trained_bert_artifact, "--data", sentiment_csv["test"], "--gate", "acc>=0.0"
    )
    assert result.code == 0, result.err
    path = Path(result.out.strip())
    assert result.out == f"{path}\n"
    gate = open_artifact(path).manifest.summary["gate"]
    assert gate == {"expression": "acc>=0", "passed": True, "failures": []}


def test_eval_gate_that_fails_exits_3_and_keeps_the_artifact(
    cli: Callable[..., Any], trained_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    result = cli(
        "eval", trained_bert_artifact, "--data", sentiment_csv["test"], "--gate", "acc>=1.01"
    )
    assert result.code == 3, result.err
    lines = result.out.splitlines()
    assert len(lines) == 1
    path = Path(lines[0])
    artifact = open_artifact(path)
    assert artifact.kind == "eval"
    summary = artifact.manifest.summary
    acc = summary["acc"]
    assert 0.85 <= acc <= 1.0
    assert summary["gate"]["passed"] is False
    assert summary["gate"]["failures"] == [{"metric": "acc", "value": acc, "bound": "acc>=1.01"}]
    errors = [line for line in result.err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.err
    assert "acc" in errors[0] and f"{acc:.4g}" in errors[0] and "acc>=1.01" in errors[0]


@pytest.mark.parametrize(("gate", "words"), [("acc>>1", "cannot parse"), ("bogus>=1", "bogus")])
def test_eval_bad_gate_exits_1_before_any_work(
    cli: Callable[..., Any],
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    gate: str,
    words: str,
) -> None:
    result = cli("eval", trained_bert_artifact, "--data", sentiment_csv["test"], "--gate", gate)
    assert result.code == 1, result.err
    assert result.out == ""
    errors = [line for line in result.err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and words in errors[0], result.err
    assert _artifacts_empty()
