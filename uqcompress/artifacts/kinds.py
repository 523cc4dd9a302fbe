"""Every artifact kind this version writes, its current ``kind_version``, and migrations.

Bump a kind's version whenever its files change meaning, add a migration from the previous
version below (a function that upgrades the manifest dict in memory), and say so in CHANGELOG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KIND_VERSIONS: dict[str, int] = {
    "model": 2,  # 2: fuse's fusion_exactness_max_logit_diff and change_vs_members
    "eval": 2,  # 2: model-only latency_ms, latency_e2e_ms; tie-grouped float64 AURC
    "onnx": 1,
    "scores": 1,
    "members": 1,
    "safetensors": 1,
    "compare": 1,
}


def _same(raw: dict[str, Any]) -> dict[str, Any]:
    """A version whose files read as the next one's (the new keys are absent: shown as -)."""
    return raw


def _model_1_to_2(raw: dict[str, Any]) -> dict[str, Any]:
    """model 2 (issue 26): `fuse` names its parity number for what it measures (the fusion's
    exactness vs the members with the averaged embeddings/MLP put in) and adds
    `change_vs_members`, which version 1 never measured (left absent)."""
    summary = raw.get("summary")
    old_key = "max_logit_diff_vs_members"
    if raw.get("step") == "fuse" and isinstance(summary, dict) and old_key in summary:
        summary["fusion_exactness_max_logit_diff"] = summary.pop(old_key)
    return raw


# (kind, from_version) -> function turning a manifest dict of that version into the next one.
MIGRATIONS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    # eval 1 -> 2: its latency_ms of an ONNX model included preprocessing; there is no
    # latency_e2e_ms (tables show "-"); its aurc may depend on row order. Every other
    # metric reads the same.
    ("eval", 1): _same,
    ("model", 1): _model_1_to_2,
}
