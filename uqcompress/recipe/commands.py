"""What a recipe step may say: the parameters of the `uqc` command it runs.

Read from the command functions themselves (their signatures and `typer.Option`/
`typer.Argument` annotations), so a recipe key is exactly a CLI option with dashes as
underscores, and a new option is usable in recipes the moment it exists.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

# Commands that write one artifact and can be a recipe step (`run` and `demo` orchestrate,
# `predict`, `inspect` and `verify` write none).
STEP_COMMANDS = (
    "init",
    "import",
    "finetune",
    "score",
    "prune",
    "fuse",
    "svd-ensemble",
    "distill-director",
    "calibrate",
    "export",
    "eval",
    "compare",
)
# Options the runner sets itself.
RESERVED = {
    "json_out": "the runner reads every step's result as JSON",
    "force": "use uqc run --force",
}


@dataclass(frozen=True)
class Param:
    """One parameter of a command, as a recipe key."""

    key: str  # the Python name, trailing '_' dropped: "batch_size", "import"
    flag: str | None  # "--batch-size"; None for a positional argument
    kind: type  # int, float, str or bool (Path counts as str)
    many: bool  # a list: repeatable option or variadic argument
    required: bool


@dataclass(frozen=True)
class Command:
    name: str
    params: dict[str, Param]

    def argv(self, values: dict[str, Any]) -> list[str]:
        """The command line for already checked values: options, then `--` and the arguments
        in order. No value can become an option, even one the recipe check let through: an
        option always takes the next word as its value, and after `--` every word is an
        argument (`models = ["--out=/x"]` names a path, never an output folder)."""
        options: list[str] = [self.name]
        arguments: list[str] = []
        for param in self.params.values():
            if param.key not in values:
                continue
            value = values[param.key]
            items = value if isinstance(value, list) else [value]
            if param.flag is None:
                arguments += [str(v) for v in items]
            elif param.kind is bool:
                if value:
                    options.append(param.flag)
            else:
                for item in items:
                    options += [param.flag, str(item)]
        return [*options, "--", *arguments] if arguments else options


def _callback(name: str) -> Callable[..., Any]:
    from uqcompress.cli.app import app

    for info in app.registered_commands:
        if info.name == name and info.callback is not None:
            return info.callback
    raise KeyError(name)


def _base_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, is a list) of a parameter's type hint, Optional stripped."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _base_type(inner[0])
    if origin is list:
        return _base_type(typing.get_args(hint)[0])[0], True
    if hint in (int, float, bool):
        return hint, False
    if hint is Path or hint is str:
        return str, False
    return str, False


@cache
def command(name: str) -> Command:
    """The recipe view of `uqc <name>`; KeyError if it is not a step command."""
    import typer.models

    if name not in STEP_COMMANDS:
        raise KeyError(name)
    callback = _callback(name)
    hints = typing.get_type_hints(callback, include_extras=True)
    params: dict[str, Param] = {}
    for pname, parameter in inspect.signature(callback).parameters.items():
        hint = hints[pname]
        info = next(
            (
                m
                for m in getattr(hint, "__metadata__", ())
                if isinstance(m, typer.models.ParameterInfo)
            ),
            None,
        )
        scalar, many = _base_type(typing.get_args(hint)[0] if info is not None else hint)
        flag: str | None = None
        if isinstance(info, typer.models.OptionInfo):
            # typer.Option("--name", ...) keeps its first declaration in `default`
            names = [info.default, *(info.param_decls or ())]
            decls = [d for d in names if isinstance(d, str) and d.startswith("--")]
            flag = decls[0].split("/")[0] if decls else "--" + pname.replace("_", "-")
        key = pname.rstrip("_")
        params[key] = Param(
            key=key,
            flag=flag,
            kind=scalar,
            many=many,
            required=parameter.default is inspect.Parameter.empty,
        )
    return Command(name=name, params=params)
