"""A recipe value is never an option of the command its step runs (issue 14, item 11)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.artifacts import open_artifact
from uqcompress.recipe.commands import command
from uqcompress.recipe.parse import Recipe, RecipeError, Step, load_recipe
from uqcompress.recipe.runner import StepFailed, run_recipe

LABELS = '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]'
INIT = f'[steps.base]\nrun = "init"\nfamily = "vit"\nlabels = {LABELS}\n'


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text("# a recipe\n" + body, encoding="utf-8")
    return path


def _problems(path: Path, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path, overrides)
    return caught.value.problems


OPTION = "starts with '-' like a command-line option"


def test_option_like_values_are_refused_all_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        INIT
        + '[steps.tuned]\nrun = "finetune"\nmodel = "-h"\ndata = "--help"\n'
        + f'[steps.e]\nrun = "eval"\nmodels = ["--out={tmp_path / "x"}", "@base"]\n'
        + 'data = "builtin:digits@test"\nood = ["builtin:photo-patches", "-x"]\n'
        + '[steps.other]\nrun = "init"\nfamily = "vit"\nlabels = ["neg", "--force"]\n'
        + 'set = ["--out=/tmp/elsewhere"]\n',
    )
    problems = _problems(path)
    for where, value in [
        ("steps.tuned.model", "-h"),  # a positional argument
        ("steps.tuned.data", "--help"),  # an option's value
        ("steps.e.models", f"--out={tmp_path / 'x'}"),  # an item of a variadic argument
        ("steps.e.ood", "-x"),  # an item of a repeatable option
        ("steps.other.labels", "--force"),  # an item of a list joined into one value
        ("steps.other.set", "--out=/tmp/elsewhere"),
    ]:
        line = f"{where}: {value!r} {OPTION}"
        assert any(p.startswith(line) for p in problems), (line, problems)
    assert len(problems) == 6, problems


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("steps.e.data=--help", "steps.e.data: '--help'"),
        ("steps.e.models=--out=/tmp/x,@base", "steps.e.models: '--out=/tmp/x'"),
        ("vars.test=--out=/tmp/x", "steps.e.data: '--out=/tmp/x'"),  # through ${vars.test}
    ],
)
def test_option_like_values_given_with_set_are_refused(
    tmp_path: Path, override: str, where: str
) -> None:
    path = _write(
        tmp_path,
        '[vars]\ntest = "builtin:digits@test"\n'
        + INIT
        + '[steps.e]\nrun = "eval"\nmodels = ["@base"]\ndata = "${vars.test}"\n',
    )
    load_recipe(path)  # fine as written
    problems = _problems(path, [override])
    assert len(problems) == 1 and problems[0].startswith(f"{where} {OPTION}"), problems


def test_negative_numbers_are_values(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[steps.base]\nrun = "init"\nfamily = "bert"\nlabels = ["-1", "1"]\nseed = -3\n'
        '[steps.tuned]\nrun = "finetune"\nmodel = "@base"\ndata = "x.csv"\n',
    )
    recipe = load_recipe(path, ["steps.tuned.seed=-2", "steps.tuned.lr=-0.5"])
    base, tuned = recipe.steps
    assert base.values["labels"] == "-1,1" and base.values["seed"] == -3
    assert tuned.values["seed"] == -2 and tuned.values["lr"] == -0.5
    argv = command("init").argv(base.values)
    assert argv[argv.index("--labels") + 1] == "-1,1" and argv[argv.index("--seed") + 1] == "-3"


def test_a_negative_number_reaches_the_command_as_a_value(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    path = _write(
        tmp_path,
        '[steps.base]\nrun = "init"\nfamily = "bert"\nlabels = ["-1", "1"]\nseed = -3\n',
    )
    result = cli("run", path, "--json")
    assert result.code == 0, result.err
    artifact = open_artifact(Path(json.loads(result.out)["path"]))
    assert artifact.manifest.config["labels"] == ["-1", "1"]
    assert artifact.manifest.config["seed"] == -3


def test_arguments_follow_a_double_dash(tmp_path: Path) -> None:
    argv = command("eval").argv({"models": ["-m", "b"], "data": "-d", "ood": ["-o"]})
    assert argv == ["eval", "--data", "-d", "--ood", "-o", "--", "-m", "b"]
    assert command("init").argv({"family": "vit"}) == ["init", "--family", "vit"]


def test_a_value_that_slipped_past_the_check_cannot_become_an_option(
    tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    """Defence in depth: a step built without the check (as a future code path might) runs
    `--out=...` as the path of a model, not as the eval's output folder."""
    elsewhere = tmp_path / "elsewhere"
    step = Step(
        name="e",
        command="eval",
        values={
            "models": [f"--out={elsewhere}", str(tiny_vit_artifact)],
            "data": "builtin:digits@test",
        },
    )
    recipe = Recipe(path=tmp_path / "r.toml", variables={}, steps=[step], gate=None)
    with pytest.raises(StepFailed) as caught:
        run_recipe(recipe)
    assert f"--out={elsewhere} does not exist" in caught.value.message
    assert not elsewhere.exists()


def test_help_as_a_value_is_named_not_run(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _write(tmp_path, INIT + '[steps.e]\nrun = "eval"\nmodels = ["--help"]\ndata = "d"\n')
    result = cli("run", path)
    assert result.code == 1
    assert result.out == ""
    assert f"steps.e.models: '--help' {OPTION}" in result.err
    assert not (tmp_path / "artifacts").exists()


def test_matrix_row_an_option_like_set_value(
    cli: Callable[..., Any], tmp_path: Path, _artifacts_root: Path
) -> None:
    """Its docs/bad-input.md row: one line, exit 1, nothing on stdout, nothing written."""
    path = _write(tmp_path, '[vars]\ntrain = "builtin:digits@train"\n' + INIT)
    result = cli("run", path, "--set", "steps.base.family=--help")
    assert result.code == 1
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(fix: " in lines[0]
    assert f"steps.base.family: '--help' {OPTION}" in lines[0]
    assert not _artifacts_root.exists()
