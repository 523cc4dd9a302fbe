"""Quality gates: `--gate "acc>=0.9,ece<=0.05,ood.photo-patches.msp.auroc>=0.8"`.

A gate is a comma-separated list of `METRIC OP NUMBER` bounds, OP one of >=, <=, >, <.
Expressions and metric names are checked before any work (exit 1); a bound that fails
after the work exits 3, naming the metric, its value and the bound.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from uqcompress.errors import ConfigError

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_CLAUSE = re.compile(
    r"^\s*([A-Za-z0-9_.\-]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)

CORE_METRICS = (
    "acc",
    "f1_macro",
    "mcc",
    "nll",
    "brier",
    "ece",
    "aurc",
    "latency_ms",
    "latency_e2e_ms",
    "parameters",
    "members",
)
# M > 1 only: test-set means of predictive entropy, expected entropy (aleatoric) and mutual
# information (epistemic); for one model the last two are degenerate (= entropy, 0).
UNCERTAINTY_METRICS = ("entropy", "aleatoric", "mi")
ENSEMBLE_METRICS = ("disagreement", *UNCERTAINTY_METRICS)
OOD_SCORES = ("msp", "entropy")
ENSEMBLE_OOD_SCORES = ("mi",)
OOD_METRICS = ("auroc", "aupr", "fpr95")
# Reported for a model made by `uqc calibrate` (the abstain_* ones with an abstention rule).
CALIBRATION_METRICS = ("temperature", "nll_uncalibrated", "ece_uncalibrated")
ABSTAIN_METRICS = ("abstain_coverage", "abstain_risk")


@dataclass(frozen=True)
class Bound:
    metric: str
    op: str
    value: float

    def holds(self, actual: float) -> bool:
        return not math.isnan(actual) and _OPS[self.op](actual, self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def known_metrics(
    ood_sets: Iterable[str], members: int, calibrated: bool = False, abstains: bool = False
) -> list[str]:
    """Every metric key `uqc eval` reports for these OOD sets, ensemble size and calibration."""
    keys = list(CORE_METRICS)
    if calibrated:
        keys += CALIBRATION_METRICS
    if abstains:
        keys += ABSTAIN_METRICS
    scores = list(OOD_SCORES)
    if members > 1:
        keys += ENSEMBLE_METRICS
        scores += ENSEMBLE_OOD_SCORES
    for name in ood_sets:
        keys += [f"ood.{name}.{s}.{m}" for s in scores for m in OOD_METRICS]
    return keys


def parse_gate(expression: str, known: list[str]) -> list[Bound]:
    """Parse and check a gate expression against the metrics that will exist."""
    bounds = []
    for clause in (c for c in expression.split(",")):
        match = _CLAUSE.match(clause)
        if not clause.strip() or match is None:
            raise ConfigError(
                f"--gate: cannot parse {clause.strip()!r}",
                hint='write bounds as METRIC OP NUMBER joined by commas, e.g. "acc>=0.9,ece<=0.05"',
            )
        metric, op, value = match.groups()
        if metric not in known:
            close = [k for k in known if k.split(".")[-1] == metric.split(".")[-1]][:4]
            suggestion = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(
                f"--gate: unknown metric {metric!r}{suggestion}",
                hint=f"gateable metrics here: {', '.join(known[:12])}"
                + (" ..." if len(known) > 12 else ""),
            )
        bounds.append(Bound(metric=metric, op=op, value=float(value)))
    return bounds


def evaluate_gate(bounds: list[Bound], metrics: dict[str, Any]) -> dict[str, Any]:
    """The gate's verdict, stored in the eval summary: passed, and each failed bound."""
    failures = [
        {"metric": b.metric, "value": float(metrics[b.metric]), "bound": str(b)}
        for b in bounds
        if not b.holds(float(metrics[b.metric]))
    ]
    return {
        "expression": ",".join(str(b) for b in bounds),
        "passed": not failures,
        "failures": failures,
    }


def describe_failures(verdict: dict[str, Any]) -> str:
    return "; ".join(
        f"{f['metric']} = {f['value']:.4g} fails {f['bound']}" for f in verdict["failures"]
    )
