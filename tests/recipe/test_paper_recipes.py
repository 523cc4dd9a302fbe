"""The papers' protocols as recipes run end to end on tiny models (issue 20, items 4 and 5), so
they cannot rot: SVE both ways (post hoc and as fine-tuning with fresh heads, the latter
exported, evaluated and quantized) and DIRECTOR with the research code's training recipe."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import ok
from uqcompress.artifacts import open_artifact

RECIPES = Path(__file__).parents[2] / "recipes"
# tiny ViTs trained briefly on the 180 validation digits and tested on them: the wiring, not
# the accuracy
QUICK = [
    "vars.preset=tiny",
    "vars.train=builtin:digits@val",
    "vars.test=builtin:digits@val",
    "gate.acc=>= 0",
]


def _run(cli: Callable[..., Any], recipe: str, *sets: str) -> dict[str, Any]:
    args = [arg for item in (*QUICK, *sets) for arg in ("--set", item)]
    result = cli("run", RECIPES / recipe, "--json", *args)
    assert result.code == 0, result.err[-3000:]
    report: dict[str, Any] = json.loads(result.out)
    return report


def test_sve_finetune_recipe_runs_both_uses_and_the_result_quantizes(
    cli: Callable[..., Any],
) -> None:
    quick = ("vars.epochs=2", "steps.sve_posthoc.epochs=1", "steps.sve_finetune.epochs=1")
    report = _run(cli, "sve-finetune-digits.toml", *quick, "steps.sve_finetune.members=2")
    steps = report["steps"]
    posthoc = open_artifact(Path(steps["sve_posthoc"]["path"])).manifest
    fresh = open_artifact(Path(steps["sve_finetune"]["path"])).manifest
    assert posthoc.summary["heads"] == "copy" and fresh.summary["heads"] == "fresh"
    assert posthoc.config["heads"] == "copy" and fresh.summary["members"] == 2
    assert report["gate"]["passed"] and report["gate"]["step"] == "eval_finetune"
    compare = Path(steps["compare"]["path"])
    rows = json.loads((compare / "comparison.json").read_text())
    assert len(rows["rows"] if isinstance(rows, dict) else rows) == 2
    exported = steps["onnx"]["path"]
    assert json.loads((Path(exported) / "parity.json").read_text())["passed"]
    # a briefly trained model is nearly uniform: the drift gate is loosened as in test_quantize
    int8 = ok(
        cli(
            "quantize",
            exported,
            "--mode",
            "dynamic",
            "--data",
            "builtin:digits@val",
            "--min-agreement",
            "0.9",
        )
    )
    assert open_artifact(Path(int8)).manifest.summary["drift_agreement"] >= 0.9


def test_director_research_recipe_trains_with_adam_and_the_average(
    cli: Callable[..., Any],
) -> None:
    # 2 epochs of 2 steps: the average starts at once and folds in every other step
    quick = ("vars.teacher_epochs=2", "vars.epochs=2", "steps.director.samples=2")
    average = ("steps.director.ema_start=0", "steps.director.ema_every=2")
    report = _run(cli, "director-research-digits.toml", *quick, *average)
    director = open_artifact(Path(report["steps"]["director"]["path"])).manifest
    config = director.config
    assert (config["optimizer"], config["weight_decay"], config["ema"]) == ("adam", 5e-5, 0.995)
    assert (config["loss"], config["schedule"], config["select_best"]) == ("mse", "cosine", "acc")
    assert config["batch_size"] == 128 and director.summary["steps"] == 4
    assert report["gate"]["passed"]
