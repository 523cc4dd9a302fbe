"""One parity check for every rewrite of a model: prune, fuse and the ONNX export.

A rewrite is proved by running the rewritten model and its reference on the same batches and
comparing *every* output of the deployment contract (`contract.OUTPUT_NAMES`: member_logits,
probs, entropy, mutual_info), shape included. The check is deliberately strict about what a
max-over-differences hides:

- a NaN or infinity anywhere, on either side, fails (`max(0.0, nan)` is 0.0 in Python and
  `np.max` of a NaN difference is NaN, which compares false with any tolerance, so a naive
  running maximum silently passes NaN);
- a shape mismatch in any output fails (broadcasting must never turn `[B, 1, C]` vs
  `[B, M, C]` into a number);
- every output is gated against the tolerance, not only `probs`: drift in the uncertainty
  outputs is exactly what a user of this tool would not notice.

One exception to a single tolerance: a calibrated model divides its logits by a temperature
T, so when T < 1 the raw logits' float round-off reaches the logit outputs multiplied by 1/T
(at T = 0.02 a 3-ulp error of a logit near 250 is 1.5e-4). Those outputs are gated at atol / T
(`logit_tolerances`), the bounded ones (probs, entropy, mutual_info) at atol as always.

`Parity.max_abs_diff` holds the worst |difference| per output over all batches; steps write it
(`Parity.to_dict`) into their artifact's `parity.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uqcompress.export import contract

OutputSet = Mapping[str, Any] | Sequence[Any]  # by name, or in contract.OUTPUT_NAMES order


def _as_arrays(outputs: OutputSet, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Name -> float64 numpy array, from a mapping or a sequence in contract order (torch
    tensors are detached and moved to CPU)."""
    if isinstance(outputs, Mapping):
        missing = [n for n in names if n not in outputs]
        if missing:
            raise ValueError(f"parity outputs lack {missing}; expected {list(names)}")
        items = [outputs[n] for n in names]
    else:
        if len(outputs) != len(names):
            raise ValueError(f"parity got {len(outputs)} outputs; expected {list(names)}")
        items = list(outputs)
    arrays = {}
    for name, value in zip(names, items, strict=True):
        if hasattr(value, "detach"):  # a torch tensor, without importing torch here
            value = value.detach().float().cpu().numpy()
        arrays[name] = np.asarray(value, dtype=np.float64)
    return arrays


@dataclass
class Parity:
    """Running comparison of a rewritten model against its reference, batch by batch.

    Use: ``p = Parity(atol); p.compare(reference, produced)`` per batch; then `p.passed`,
    `p.describe()` (for the error message) and `p.to_dict()` (for `parity.json`).
    """

    atol: float
    names: tuple[str, ...] = contract.OUTPUT_NAMES
    # output -> its own tolerance where it is not `atol` (`logit_tolerances`)
    tolerances: dict[str, float] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # output -> its first failure
    batches: int = 0

    def __post_init__(self) -> None:
        for name in self.names:
            self.max_abs_diff.setdefault(name, 0.0)

    def compare(self, reference: OutputSet, produced: OutputSet) -> None:
        """Compare one batch of outputs (mappings by name, or sequences in contract order).

        Shape: each output any shape; reference and produced must have the same shape.
        """
        ref = _as_arrays(reference, self.names)
        got = _as_arrays(produced, self.names)
        self.batches += 1
        for name in self.names:
            a, b = ref[name], got[name]
            if a.shape != b.shape:
                self._fail(name, f"{name} has shape {list(b.shape)}, expected {list(a.shape)}")
                self.max_abs_diff[name] = math.inf
                continue
            bad = [
                f"{int(np.sum(~np.isfinite(x)))} non-finite values in the {side}"
                for side, x in (("reference", a), ("rewritten model", b))
                if not np.all(np.isfinite(x))
            ]
            if bad:
                self._fail(name, f"{name}: {'; '.join(bad)}")
                self.max_abs_diff[name] = math.nan
                continue
            if a.size and not math.isnan(self.max_abs_diff[name]):
                worst = float(np.max(np.abs(a - b)))
                self.max_abs_diff[name] = max(self.max_abs_diff[name], worst)

    def _fail(self, name: str, message: str) -> None:
        # One line per output is enough to diagnose; later batches repeat the same story.
        self.problems.setdefault(name, message)

    def tolerance(self, name: str) -> float:
        """The largest |difference| output `name` may show."""
        return self.tolerances.get(name, self.atol)

    @property
    def passed(self) -> bool:
        """No shape mismatch, no non-finite value, and every output within its tolerance."""
        return (
            self.batches > 0
            and not self.problems
            and all(v <= self.tolerance(k) for k, v in self.max_abs_diff.items())
        )

    def describe(self) -> str:
        """One line: the problems (if any), then the worst |diff| per output and the tolerance."""
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in self.max_abs_diff.items())
        head = "; ".join(self.problems.values())
        return (f"{head}; " if head else "") + f"max |diff| {diffs} ({describe_tolerances(self)})"

    def to_dict(self) -> dict[str, Any]:
        """What `parity.json` records (only written when the check passed, so all finite)."""
        return {
            "atol": self.atol,
            **({"tolerances": dict(self.tolerances)} if self.tolerances else {}),
            "batches": self.batches,
            "max_abs_diff": dict(self.max_abs_diff),
            "passed": self.passed,
        }


# The outputs a temperature scales without bound: the member logits z / T and the log of the
# mean probabilities (a confident example's other classes sit near -(z_max - z) / T).
LOGIT_OUTPUTS = ("member_logits", "logits")


def logit_tolerances(atol: float, temperature: float) -> dict[str, float]:
    """The tolerances of the logit outputs of a model calibrated at `temperature`: atol / T
    below T = 1 (the raw logits' round-off, multiplied by 1/T on its way out), none above
    (there a temperature shrinks the round-off; atol stays)."""
    if not 0.0 < temperature < 1.0:
        return {}
    return {name: atol / temperature for name in LOGIT_OUTPUTS}


def describe_tolerances(check: Any) -> str:
    """`atol 0.0001`, then `; member_logits, logits within 0.005 (atol / temperature)` where
    a check (`Parity`, the export's `ParityReport`) has tolerances other than its atol."""
    text = f"atol {check.atol:g}"
    loosened = {k: v for k, v in check.tolerances.items() if v != check.atol}
    if loosened:
        names = ", ".join(loosened)
        text += f"; {names} within {max(loosened.values()):.3g} (atol / temperature)"
    return text


def contract_outputs(member_logits: Any) -> dict[str, Any]:
    """The contract's four outputs of a batch of member logits, as the exported graph computes
    them (`uq.functional.uncertainty_outputs`), for rewrites checked in torch (prune, fuse).

    Shape: member_logits `[B, M, C]` -> member_logits `[B, M, C]`, probs `[B, C]`,
    entropy `[B]`, mutual_info `[B]`.
    """
    from uqcompress.uq.functional import uncertainty_outputs

    if member_logits.dim() != 3:
        raise ValueError(f"member logits must be [B, M, C]; got {list(member_logits.shape)}")
    outputs = uncertainty_outputs(member_logits)
    return {
        "member_logits": member_logits.float(),
        "probs": outputs.probs,
        "entropy": outputs.entropy,
        "mutual_info": outputs.mutual_info,
    }


PARITY_FILE = "parity.json"  # in every artifact whose step checked a rewrite


def save_parity(directory: Path, report: Any) -> None:
    """Write a parity check's numbers (`Parity` or the export's report: anything with
    `to_dict()`) as `parity.json` in an artifact being built."""
    (Path(directory) / PARITY_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
