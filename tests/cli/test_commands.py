"""The generated step commands (cli/commands.py): one option per config field, each with help."""

from __future__ import annotations

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
        assert flags - wanted <= {"--force", "--json"}, (name, flags - wanted)
        for param in command.params:
            assert getattr(param, "help", None), (name, param.name)
        assert command.help.startswith(HELP[name].strip().splitlines()[0]), name


def test_dash_stands_for_one_input_only(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("eval", "-", "-", "--data", "builtin:digits@test", stdin="x\n")
    assert result.code == 1
    assert "'-' can stand for only one of the models" in result.err
