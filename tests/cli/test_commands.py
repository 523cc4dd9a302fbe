"""The generated step commands (cli/commands.py): one option per config field, each with help."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from uqcompress.cli.app import app
from uqcompress.cli.commands import HELP
from uqcompress.steps.registry import step


def test_every_generated_command_has_one_option_per_step_option_each_with_help() -> None:
    group = typer.main.get_command(app)
    for name in HELP:
        command = group.commands[name]  # type: ignore[attr-defined]
        spec = step(name)
        flags = {p.opts[0] for p in command.params if p.opts and p.opts[0].startswith("--")}
        wanted = {o.flag for o in spec.options().values() if o.flag is not None}
        assert wanted <= flags, (name, wanted - flags)
        extra = {"--force", "--json", "--dry-run", "--verbose", "--quiet"}
        assert flags - wanted <= extra, (name, flags - wanted)
        for param in command.params:
            assert getattr(param, "help", None), (name, param.name)
        assert command.help.startswith(HELP[name].strip().splitlines()[0]), name


def test_dash_stands_for_one_input_only(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("eval", "-", "-", "--data", "builtin:digits@test", stdin="x\n")
    assert result.code == 1
    assert "'-' can stand for only one of the models" in result.err


def test_predict_is_generated_from_the_registry() -> None:
    """predict is a registered step that writes no artifact: --out is its JSONL file, no --json."""
    from uqcompress.cli import app as app_module
    from uqcompress.recipe.commands import STEP_COMMANDS

    spec = step("predict")
    assert not spec.writes_artifact
    assert "predict" in HELP and "predict" not in app_module._HAND_WRITTEN
    assert "predict" not in STEP_COMMANDS  # no recipe step
    command = typer.main.get_command(app).commands["predict"]  # type: ignore[attr-defined]
    params = {p.opts[0]: p for p in command.params if p.opts}
    assert "--json" not in params
    assert params["--out"].help.startswith("Write the JSONL to this file")
    assert params["--out"].help.endswith("instead of the JSONL on stdout.")
    assert params["--force"].help == "Replace an existing --out file."
    assert command.help.startswith("Predict: label, probs (by label), entropy and mutual_info")
    for flag in ("--data", "--batch-size", "--sample-chunk", "--workers", "--device"):
        assert flag in params, flag


@pytest.mark.parametrize(
    ("flag", "value", "line"),
    [
        (
            "--sample-chunk",
            "0",
            "error: --sample-chunk 0 must be at least 1 (fix: drop --sample-chunk to size it "
            "to memory)",
        ),
        (
            "--workers",
            "-1",
            "error: --workers -1 must be 0 or more (fix: pass --workers 0 (read data in this "
            "process) or e.g. --workers 2)",
        ),
        (
            "--batch-size",
            "100000",
            "error: --batch-size 100000 is more than 8,192 (a batch is held in memory at once) "
            "(fix: pass --batch-size 8192 or less)",
        ),
        (
            "--batch-size",
            "0",
            "error: --batch-size 0 must be at least 1 (fix: pass --batch-size 64)",
        ),
    ],
)
def test_predict_refuses_bad_counts_in_one_line_before_reading_anything(
    cli,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    flag: str,
    value: str,
    line: str,
) -> None:
    """The config's checks (steps/config.problems), before the model or data is opened."""
    missing = tmp_path / "no-such-model"
    result = cli("predict", missing, "--data", tmp_path / "no.csv", flag, value)
    assert result.code == 1, result.err
    assert result.out == ""
    assert result.err.strip() == line
    assert list(tmp_path.iterdir()) == []
