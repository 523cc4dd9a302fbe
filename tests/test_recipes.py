"""Every shipped recipe names real commands, real options and defined references.

The runner (`uqc run`) is a later issue; this keeps the files correct until then, and after.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest

from uqcompress.cli.app import app

RECIPES = sorted((Path(__file__).parent.parent / "recipes").glob("*.toml"))
REFERENCE = re.compile(r"^@([\w-]+)$")
VARIABLE = re.compile(r"\$\{vars\.([\w-]+)\}")


def _options(command: str) -> set[str]:
    """The command's parameters as recipe keys (Python names, trailing '_' dropped)."""
    for info in app.registered_commands:
        if info.name == command and info.callback is not None:
            names = inspect.signature(info.callback).parameters
            return {name.rstrip("_") for name in names}
    raise AssertionError(f"unknown command {command!r}")


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def test_recipes_are_shipped() -> None:
    shipped = {"hydra-vit-digits.toml", "sve-vit-digits.toml", "director-vit-digits.toml"}
    assert shipped <= {p.name for p in RECIPES}


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_steps_map_onto_commands(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), "a recipe starts with a comment: what it does, how to run it"
    recipe = tomllib.loads(text)
    variables = recipe.get("vars", {})
    seen: list[str] = []
    for name, step in recipe["steps"].items():
        options = _options(step["run"])
        unknown = sorted(set(step) - {"run"} - options)
        assert not unknown, f"steps.{name}: {unknown} are not options of uqc {step['run']}"
        for key, value in step.items():
            for text_value in _strings(value):
                ref = REFERENCE.match(text_value)
                if ref:
                    assert ref.group(1) in seen, f"steps.{name}.{key}: {text_value} is not earlier"
                for var in VARIABLE.findall(text_value):
                    assert var in variables, f"steps.{name}.{key}: vars.{var} is not defined"
        seen.append(name)
    assert all(isinstance(v, str) for v in recipe.get("gate", {}).values())
