"""Post-hoc calibration: a temperature for the member logits and an abstention threshold.

Temperature scaling (Guo et al., 2017) for ensembles: every member's logits are divided by
one T, and T minimises the NLL of the *averaged* probabilities on held-out data, so the
ensemble's prediction is what gets calibrated, not each member alone.

Abstention (selective prediction): an uncertainty score (higher = less sure) and a threshold
t; an example is answered when score <= t. t is fitted so that a chosen fraction of the
held-out examples is answered.

Only numpy at import time: the torch-free ONNX Runtime Predictor applies the abstention rule.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# Scores an abstention rule may use, as `uq.metrics.uncertainty_scores` names them; "mi"
# needs M > 1.
ABSTAIN_SCORES = ("msp", "entropy", "mi")
# T is searched as log T in this range: beyond it the fit is degenerate (all-correct
# held-out data drives T -> 0, constant logits drive T -> infinity).
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 1e2


@dataclass(frozen=True)
class AbstainRule:
    """Answer when `score <= threshold`; fitted to answer `coverage` of the held-out data."""

    score: str
    threshold: float
    coverage: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AbstainRule:
        return cls(
            score=str(raw["score"]),
            threshold=float(raw["threshold"]),
            coverage=float(raw["coverage"]),
        )


@dataclass(frozen=True)
class Calibration:
    """What `uqc calibrate` stores in a model's config (`uqc_calibration`) and in the ONNX
    metadata: the temperature and, optionally, the abstention rule."""

    temperature: float
    abstain: AbstainRule | None = None

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"temperature": self.temperature}
        if self.abstain is not None:
            raw["abstain"] = self.abstain.to_dict()
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Calibration | None:
        if not raw:
            return None
        rule = raw.get("abstain")
        return cls(
            temperature=float(raw["temperature"]),
            abstain=AbstainRule.from_dict(rule) if rule else None,
        )


def fit_temperature(member_logits: npt.NDArray[Any], labels: npt.NDArray[Any]) -> float:
    """The T minimising the NLL of mean_m softmax(logits_m / T), by L-BFGS on log T.

    Shape: member_logits `[N, M, C]`, labels `[N]` -> scalar T in
    [MIN_TEMPERATURE, MAX_TEMPERATURE].
    """
    import torch

    logits = torch.as_tensor(np.asarray(member_logits), dtype=torch.float64)
    targets = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    members = logits.shape[1]
    low, high = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [log_t], lr=1.0, max_iter=200, tolerance_grad=1e-10, line_search_fn="strong_wolfe"
    )

    def nll() -> torch.Tensor:
        # log of the mean of member softmaxes, computed in log space for stability
        scaled = logits / log_t.clamp(low, high).exp()
        log_mean = torch.logsumexp(scaled.log_softmax(dim=-1), dim=1) - math.log(members)
        return torch.nn.functional.nll_loss(log_mean, targets)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nll()
        loss.backward()
        return loss

    optimizer.step(closure)
    return min(max(math.exp(float(log_t.detach())), MIN_TEMPERATURE), MAX_TEMPERATURE)


def abstain_scores(
    probs: npt.NDArray[Any], entropy: npt.NDArray[Any], mutual_info: npt.NDArray[Any]
) -> dict[str, npt.NDArray[np.float64]]:
    """The rule's scores from the contract's outputs (higher = less sure): the one place they
    are computed, so `calibrate` fits the threshold on exactly what the Predictor and
    `predict` compare with it (float32 outputs of `uq.functional`, widened exactly).

    Shape: probs `[N, C]`, entropy `[N]`, mutual_info `[N]` -> dict of `[N]`.
    """
    return {
        "msp": 1.0 - np.max(np.asarray(probs, dtype=np.float64), axis=1),
        "entropy": np.asarray(entropy, dtype=np.float64),
        "mi": np.asarray(mutual_info, dtype=np.float64),
    }


def fit_abstain_threshold(scores: npt.NDArray[Any], coverage: float) -> float:
    """The smallest threshold that answers at least `coverage` of the examples.

    Shape: scores `[N]` -> scalar. Ties at the threshold are all answered, so the coverage
    reached can be higher than asked.
    """
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    k = max(1, math.ceil(coverage * len(ordered) - 1e-9))
    return float(ordered[k - 1])


def abstains(rule: AbstainRule, scores: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.bool_]:
    """Shape: dict of `[N]` scores -> `[N]` bool, True where the model abstains."""
    return np.asarray(scores[rule.score] > rule.threshold)


def selective_risk(
    probs: npt.NDArray[Any], labels: npt.NDArray[Any], answered: npt.NDArray[np.bool_]
) -> tuple[float, float]:
    """(coverage, risk): the fraction answered and the error rate among those answered
    (NaN when nothing is answered).

    Shape: probs `[N, C]`, labels `[N]`, answered `[N]` bool.
    """
    answered = np.asarray(answered, dtype=bool)
    coverage = float(answered.mean())
    if not answered.any():
        return coverage, float("nan")
    wrong = np.argmax(probs, axis=1) != np.asarray(labels)
    return coverage, float(wrong[answered].mean())
