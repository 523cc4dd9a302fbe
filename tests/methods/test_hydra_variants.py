"""Hydra fuses the family variants the conformance test's tiny presets do not cover."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import ok


def test_dinov2_with_a_swiglu_mlp_fuses_exactly(tmp_path: Path, cli: Callable[..., Any]) -> None:
    base = ok(
        cli(
            "init",
            "--family",
            "dinov2",
            "--num-labels",
            "3",
            "--set",
            "use_swiglu_ffn=true",
            "--out",
            tmp_path / "base",
        )
    )
    scores = ok(cli("score", base, "--method", "l2", "--out", tmp_path / "scores"))
    members = ok(
        cli("prune", scores, "--members", "2", "--select", "partition", "--out", tmp_path / "m")
    )
    fused = ok(cli("fuse", members, "--out", tmp_path / "hydra"))
    summary = json.loads((Path(fused) / "manifest.json").read_text())["summary"]
    assert summary["exact"] is True and summary["fusion_exactness_max_logit_diff"] < 1e-4
    weights = json.loads((Path(base) / "config.json").read_text())
    assert weights["use_swiglu_ffn"] is True
