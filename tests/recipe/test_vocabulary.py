"""One recipe key vocabulary across steps: `model` is what a step reads (one model, or a
list for eval's deep ensemble and fuse's pruned models), prune reads `scores`, `members` is
only ever a count; old spellings still load, with one deprecation line each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.recipe.parse import RecipeError, Ref, load_recipe

LABELS = '["a", "b"]'
INIT = f'[steps.init]\nrun = "init"\nfamily = "vit"\nlabels = {LABELS}\n'
SCORE = '[steps.s]\nrun = "score"\nmodel = "@init"\nmethod = "l2"\n'


def _load(tmp_path: Path, body: str, overrides: list[str] | None = None) -> Any:
    path = tmp_path / "recipe.toml"
    path.write_text("# x\n" + INIT + body, encoding="utf-8")
    return load_recipe(path, overrides)


def test_model_is_the_input_of_eval_and_fuse(tmp_path: Path) -> None:
    recipe = _load(
        tmp_path,
        SCORE
        + '[steps.m]\nrun = "prune"\nscores = "@s"\nmembers = 2\nselect = "partition"\n'
        + '[steps.f]\nrun = "fuse"\nmodel = "@m"\n'
        + '[steps.e]\nrun = "eval"\nmodel = ["@f", "@init"]\ndata = "x.csv"\n',
    )
    steps = {s.name: s for s in recipe.steps}
    assert steps["f"].values["members"] == [Ref("m")]  # fuse's input role, from `model`
    assert steps["e"].values["models"] == [Ref("f"), Ref("init")]
    assert steps["m"].values["members"] == 2  # the count
    assert recipe.deprecations == []


def test_prune_reads_scores_alone_or_a_model_with_scores(tmp_path: Path) -> None:
    alone = _load(tmp_path, SCORE + '[steps.p]\nrun = "prune"\nscores = "@s"\nratio = 0.5\n')
    values = {s.name: s for s in alone.steps}["p"].values
    assert values["input"] == Ref("s") and "scores" not in values
    both = _load(
        tmp_path,
        SCORE + '[steps.p]\nrun = "prune"\nmodel = "@init"\nscores = "@s"\nratio = 0.5\n',
    )
    values = {s.name: s for s in both.steps}["p"].values
    assert values["input"] == Ref("init") and values["scores"] == Ref("s")


@pytest.mark.parametrize(
    ("body", "old", "new"),
    [
        ('[steps.e]\nrun = "eval"\nmodels = ["@init"]\ndata = "x.csv"\n', "models", "model"),
        ('[steps.t]\nrun = "export"\nmodels = ["@init"]\n', "models", "model"),
        (SCORE + '[steps.p]\nrun = "prune"\ninput = "@s"\nratio = 0.5\n', "input", "model"),
        (
            SCORE
            + '[steps.m]\nrun = "prune"\nscores = "@s"\nmembers = 2\nselect = "partition"\n'
            + '[steps.f]\nrun = "fuse"\nmembers = ["@m"]\n',
            "members",
            "model",
        ),
    ],
)
def test_old_spellings_load_with_one_deprecation_line(
    tmp_path: Path, body: str, old: str, new: str
) -> None:
    recipe = _load(tmp_path, body)
    assert len(recipe.deprecations) == 1
    line = recipe.deprecations[0]
    assert f".{old}: '{old}' is the old spelling of '{new}'" in line
    assert "until the next release" in line
    if old == "input":  # prune's input was nearly always its scores
        assert "write scores = ..., or model = ... with it" in line


def test_one_input_under_two_spellings_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as caught:
        _load(
            tmp_path,
            SCORE
            + '[steps.m]\nrun = "prune"\nscores = "@s"\nmembers = 2\nselect = "partition"\n'
            + '[steps.f]\nrun = "fuse"\nmodel = "@m"\nmembers = ["@m"]\n',
        )
    assert any("model and members are the same key" in p for p in caught.value.problems)


def test_set_reaches_the_key_under_the_spelling_the_recipe_used(tmp_path: Path) -> None:
    recipe = _load(
        tmp_path,
        '[steps.e]\nrun = "eval"\nmodels = ["@init"]\ndata = "x.csv"\n'
        + '[steps.e2]\nrun = "eval"\nmodel = "@init"\ndata = "x.csv"\n',
        ["steps.e.model=a,b", "steps.e2.model=c"],
    )
    steps = {s.name: s for s in recipe.steps}
    assert steps["e"].values["models"] == ["a", "b"]
    assert steps["e2"].values["models"] == ["c"]


def test_missing_input_is_named_by_its_recipe_key(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as caught:
        _load(tmp_path, '[steps.e]\nrun = "eval"\ndata = "x.csv"\n')
    assert "steps.e: missing 'model' (uqc eval requires it)" in caught.value.problems


def test_run_prints_the_deprecation_on_stderr(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text(
        "# x\n" + INIT + '[steps.t]\nrun = "export"\nmodels = ["@init"]\n', encoding="utf-8"
    )
    result = cli("run", path, "--dry-run")
    assert result.code == 0, result.err
    lines = [line for line in result.err.splitlines() if "old spelling" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: recipe ")
    assert "steps.t.models: 'models' is the old spelling of 'model'" in lines[0]
