"""The full demo meets its accuracy bar (slow: about 2-3 minutes on 2 cores; `pytest -m slow`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from uqcompress.artifacts import open_artifact


@pytest.mark.slow
def test_full_demo_meets_its_bar(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("demo", "--out", str(tmp_path / "demo"), "--device", "cpu")
    assert result.code == 0, result.err
    single = open_artifact(tmp_path / "demo" / "eval-single").manifest.summary
    ensemble = open_artifact(tmp_path / "demo" / "eval-ensemble").manifest.summary
    assert single["acc"] >= 0.95
    assert ensemble["acc"] >= 0.95
    assert ensemble["nll"] < single["nll"]  # the ensemble's promise: better uncertainty
    hydra = open_artifact(tmp_path / "demo" / "eval-hydra").manifest.summary
    assert hydra["members"] == 3 and hydra["acc"] >= 0.95
    assert hydra["parameters"] < single["parameters"]  # 3 members of H/3 heads, shared MLP
    sve = open_artifact(tmp_path / "demo" / "eval-sve").manifest.summary
    assert sve["members"] == 4 and sve["acc"] >= 0.95
    student = open_artifact(tmp_path / "demo" / "eval-director").manifest.summary
    assert student["members"] == 10 and student["acc"] >= 0.9
    mc_dropout = open_artifact(tmp_path / "demo" / "eval-mc-dropout").manifest.summary
    assert mc_dropout["members"] == 10 and mc_dropout["acc"] >= 0.9
