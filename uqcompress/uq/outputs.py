"""The one record of what a model predicts: the contract's four outputs for N examples.

Every backend returns it: the torch-free ONNX Runtime `Predictor` (`export.runtime.Prediction`,
which adds the predicted labels and abstention flags) and the prediction sources that `eval`,
`predict` and `calibrate` read (`engine.sources.MemberOutputs`, which adds timings). Both are
this record with their extra fields, so the four outputs are named, shaped, checked and
concatenated in one place. numpy only: the torch-free runtime imports it. In a graph the same
four are torch tensors (`uq.functional.UncertaintyOutputs`, `export.contract.OUTPUT_NAMES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# The record's fields: also the exported graph's output names, in order
# (export/contract.OUTPUT_NAMES is this tuple).
OUTPUT_FIELDS = ("member_logits", "probs", "entropy", "mutual_info")


@dataclass(frozen=True)
class ModelOutputs:
    """The contract's four outputs for N examples.

    Shape: member_logits `[N, M, C]` (M = 1 for a single model), probs `[N, C]` (the mean of
    the members' softmax), entropy `[N]` (total, in nats), mutual_info `[N]` (the epistemic
    part, in nats). The predictor keeps them as the graph computes them (float32); the
    prediction sources hold probs, entropy and mutual information in float64 for metrics.
    """

    member_logits: npt.NDArray[np.float32]
    probs: npt.NDArray[Any]
    entropy: npt.NDArray[Any]
    mutual_info: npt.NDArray[Any]

    def arrays(self) -> tuple[npt.NDArray[Any], ...]:
        """The four outputs, in the contract's order."""
        return tuple(getattr(self, name) for name in OUTPUT_FIELDS)

    def outputs(self, metrics_dtype: Any = None) -> dict[str, npt.NDArray[Any]]:
        """The four outputs by name, as keyword arguments for another record of them;
        `metrics_dtype` (e.g. np.float64): probs, entropy and mutual information cast to it
        (member logits stay as they are)."""
        fields = dict(zip(OUTPUT_FIELDS, self.arrays(), strict=True))
        if metrics_dtype is not None:
            for name in OUTPUT_FIELDS[1:]:
                fields[name] = fields[name].astype(metrics_dtype)
        return fields


def concat_outputs(parts: Sequence[ModelOutputs]) -> dict[str, npt.NDArray[Any]]:
    """The four outputs of consecutive slices of one data set, one after the other, as
    keyword arguments for the record that holds them.

    Shape: each part's arrays `[N_i, ...]` -> `[sum N_i, ...]`.
    """
    return {
        name: np.concatenate([getattr(p, name) for p in parts], axis=0) for name in OUTPUT_FIELDS
    }


def non_finite_rows(outputs: ModelOutputs) -> npt.NDArray[np.bool_]:
    """`[N]` bool: True where any of an example's four outputs is NaN or infinite."""
    rows = len(outputs.probs)
    bad = np.zeros(rows, dtype=bool)
    for values in outputs.arrays():
        bad |= ~np.isfinite(values.reshape(rows, -1)).all(axis=1)
    return bad
