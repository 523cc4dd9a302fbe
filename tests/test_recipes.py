"""Every shipped recipe passes the runner's check (real commands, real options, defined
references and variables, known gate metrics), starts with its how-to comment, and the
compare recipe runs end to end (tiny models) with its table and PNG."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.recipe.parse import load_recipe

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))
SHIPPED = {
    "hydra-vit-digits.toml",
    "sve-vit-digits.toml",
    "director-vit-digits.toml",
    "compare-digits.toml",
    "hydra-bert-csv.toml",
}


def test_recipes_are_shipped() -> None:
    assert {p.name for p in RECIPES} >= SHIPPED


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_passes_the_check(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), "a recipe starts with a comment: what it does, how to run it"
    assert f"uqc run recipes/{path.name}" in text, "the header says how to run it"
    recipe = load_recipe(path)  # raises RecipeError listing every problem
    assert recipe.gate is not None and recipe.gate.bounds, "every shipped recipe has a gate"


def test_compare_recipe_runs_every_method(cli: Callable[..., Any], tmp_path: Path) -> None:
    """compare-digits with tiny ViTs and short training: the wiring, not the accuracy."""
    path = Path(__file__).parent.parent / "recipes" / "compare-digits.toml"
    tiny = ["vars.preset=tiny", "vars.epochs=2"]
    tiny += [f"steps.{s}.epochs=1" for s in ("pruned_tuned", "hydra_tuned", "sve", "director")]
    tiny += [
        "steps.director.samples=2",
        "gate.acc=>= 0",
        "gate.ood.photo-patches.entropy.auroc=>= 0",
    ]
    args = [arg for item in tiny for arg in ("--set", item)]
    result = cli("run", path, "--json", *args)
    assert result.code == 0, result.err[-3000:]
    report = json.loads(result.out)
    compare = Path(report["path"])
    assert report["steps"]["compare"]["kind"] == "compare"
    table = json.loads((compare / "comparison.json").read_text())
    rows = table["rows"] if isinstance(table, dict) else table
    assert len(rows) == 8
    assert (compare / "comparison.png").stat().st_size > 10_000
    assert report["gate"]["passed"] and report["gate"]["step"] == "eval_hydra"
    assert report["gate"]["values"]["params_ratio"] < 1  # Hydra: smaller than one ViT
    calibrated = json.loads(
        (Path(report["steps"]["eval_calibrated"]["path"]) / "metrics.json").read_text()
    )
    assert "temperature" in calibrated and "abstain_risk" in calibrated
