"""benchmarks/prune_protocols.py on a tiny ViT: the papers' pruning protocols side by side, and
HIES's stability measure (spread of the pruned model's accuracy over calibration seeds)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "prune_protocols.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("prune_protocols", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_protocols_report_cost_results_and_stability(tmp_path: Path, capsys: Any) -> None:
    script = _script()
    out = tmp_path / "runs"
    result = script.main(
        ["--quick", "--seeds", "2", "--alphas", "0.5", "--only", "hies,headmap", "--out",
         str(out), "--json", str(tmp_path / "r.json"), "--threads", "1"]
    )  # fmt: skip
    labels = [r["protocol"] for r in result["rows"]]
    assert labels == ["hies a=0.5 global", "hies a=0.5 layer", "headmap"]
    rows = {r["protocol"]: r for r in result["rows"]}
    # the stability is the spread of the per-seed evals' accuracy, recomputed from the artifacts
    for label, row in rows.items():
        name = label.replace(" ", "-").replace("=", "")
        accs = [
            json.loads((out / f"eval-{name}-seed{s}" / "manifest.json").read_text())["summary"][
                "acc"
            ]
            for s in range(2)
        ]
        assert row["acc"] == statistics.fmean(accs)
        assert row["acc_std_points"] == 100 * statistics.pstdev(accs)
        assert row["acc_min"] == min(accs) and row["seeds"] == 2
    assert rows["headmap"]["evaluations"] == 8  # HeadMap: one per head, L*H = 2*4
    assert rows["hies a=0.5 global"]["evaluations"] is None  # gradient scores
    # per layer: every seed keeps 2 of 4 heads in each layer; global: 4 of 8 in all
    assert all(h == [2, 2] for h in rows["hies a=0.5 layer"]["heads_per_layer"])
    assert all(sum(h) == 4 for h in rows["hies a=0.5 global"]["heads_per_layer"])
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == result["rows"]
    printed = capsys.readouterr().out
    assert "| headmap | 8 |" in printed and "| unpruned |" in printed
