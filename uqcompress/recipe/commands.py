"""What a recipe step may say: the options of the step it runs, from the step registry.

A recipe key is a CLI option of the step with dashes as underscores, or one of its input
roles: both come from the step registry (`steps/registry.py`: the config's fields and the
step's inputs), so a new config field is usable in recipes the moment it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from uqcompress.steps.registry import STEPS, Role
from uqcompress.steps.registry import Option as Param  # a recipe key: an option of the step

# Steps that write one artifact and can be a recipe step (`run` and `demo` orchestrate,
# `predict`, `inspect` and `verify` write none).
STEP_COMMANDS = tuple(name for name, spec in STEPS.items() if spec.writes_artifact)
# Registered steps that write no artifact, so no recipe runs them (predict).
NOT_IN_RECIPES = tuple(name for name, spec in STEPS.items() if not spec.writes_artifact)
# Options the runner sets itself.
RESERVED = {
    "json_out": "the runner collects every step's result; use uqc run --json",
    "force": "use uqc run --force",
}


@dataclass(frozen=True)
class Command:
    name: str
    params: dict[str, Param]
    roles: tuple[Role, ...] = ()

    def spellings(self) -> dict[str, str]:
        """Recipe key -> option key: every option by its key, an input role by its recipe
        name (`model` for eval's models and fuse's members)."""
        keys = {key: key for key, param in self.params.items() if not param.role}
        keys.update({role.recipe_name: role.key for role in self.roles})
        return keys

    def old_spellings(self) -> dict[str, str]:
        """Old recipe key -> the recipe key to write instead (accepted for one release):
        a role's own key where its recipe name differs, and `models` for `model`."""
        old = {role.key: role.recipe_name for role in self.roles if role.key != role.recipe_name}
        if "model" in self.spellings() and "models" not in self.params:
            old.setdefault("models", "model")
        return old

    def option_key(self, recipe_key: str) -> str:
        """The option a recipe key sets (itself when it is none: the check reports it)."""
        spelled = self.spellings()
        new = self.old_spellings().get(recipe_key, recipe_key)
        return spelled.get(new, recipe_key)

    def argv(self, values: dict[str, Any]) -> list[str]:
        """The `uqc` command line a step equals (shown in `uqc run --json`), for already
        checked values: options, then `--` and the arguments in order. No value can become an
        option, even one the recipe check let through: an option always takes the next word as
        its value, and after `--` every word is an argument (`models = ["--out=/x"]` names a
        path, never an output folder)."""
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


@cache
def command(name: str) -> Command:
    """The recipe view of `uqc <name>`; KeyError if it is not a step command."""
    step = STEPS[name]
    return Command(name=name, params=dict(step.options()), roles=step.inputs)
