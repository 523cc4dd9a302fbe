"""Read a recipe, apply `--set` overrides, and check the whole file before anything runs.

TOML parsers give no line numbers for values, so every problem is reported by its key path
(`steps.base.epochs`), and all of them at once: a user fixes a recipe in one round.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uqcompress.errors import ConfigError
from uqcompress.recipe.commands import NOT_IN_RECIPES, RESERVED, STEP_COMMANDS, Param, command
from uqcompress.uq.quality_gates import Bound

STEP_NAME = re.compile(r"[A-Za-z0-9_-]+")
REFERENCE = re.compile(r"^@([A-Za-z0-9_-]+)$")
VARIABLE = re.compile(r"\$\{vars\.([A-Za-z0-9_-]+)\}")
# What a command line reads as an option ("--out=/x", "--help", "-h"). Negative numbers
# ("-1", "-0.5", "-1,1") and "-" (refused on its own) are not.
OPTION_LIKE = re.compile(r"-[^\d.]")
TOP_LEVEL = ("vars", "steps", "gate")
GATE_KEYS = ("step", "baseline")  # the rest of [gate] are metric bounds
RATIO_METRICS = ("params_ratio", "flops_ratio")  # need gate.baseline


@dataclass(frozen=True)
class Ref:
    """`"@name"`: the artifact path of step `name`, known once it has run."""

    step: str


@dataclass
class Step:
    name: str
    command: str
    values: dict[str, Any]  # checked values by recipe key; Ref where a step's output goes
    needs: list[str] = field(default_factory=list)  # steps referenced, in key order


@dataclass
class Gate:
    step: str  # the eval step whose metrics are bounded
    baseline: str | None  # eval step the *_ratio metrics divide by
    bounds: list[Bound]


@dataclass
class Recipe:
    path: Path
    variables: dict[str, Any]
    steps: list[Step]  # in run order: file order, moved after the steps they reference
    gate: Gate | None
    # old spellings the recipe used (accepted for one release): one line each for stderr
    deprecations: list[str] = field(default_factory=list)


class RecipeError(ConfigError):
    """Every problem of a recipe, one per line."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        message = (
            f"recipe {path}: {problems[0]}"
            if len(problems) == 1
            else f"recipe {path} has {len(problems)} problems:\n"
            + "\n".join(f"  {p}" for p in problems)
        )
        super().__init__(
            message,
            hint="fix the keys named above; uqc run --dry-run checks a recipe without running it",
        )
        self.problems = problems


def load_recipe(path: Path, overrides: list[str] | None = None) -> Recipe:
    """Parse, override and check a recipe; raises RecipeError listing every problem."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"recipe {path} is a directory", hint="pass a recipes/*.toml file")
    if not path.is_file():
        raise ConfigError(f"recipe {path} does not exist", hint="pass a recipes/*.toml file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"recipe {path} is not valid TOML: {exc}", hint="fix the syntax") from exc
    problems: list[str] = []
    _apply_overrides(raw, overrides or [], problems)
    for key in raw:
        if key not in TOP_LEVEL:
            problems.append(f"{key}: unknown table (a recipe has {', '.join(TOP_LEVEL)})")
    variables = _variables(raw.get("vars", {}), problems)
    deprecations: list[str] = []
    steps = _steps(raw.get("steps"), variables, problems, deprecations)
    ordered = _order(steps, problems)
    gate = _gate(raw.get("gate"), steps, problems)
    if problems:
        raise RecipeError(path, problems)
    return Recipe(path, variables, ordered, gate, deprecations)


# --- overrides ------------------------------------------------------------------------------


def _apply_overrides(raw: dict[str, Any], overrides: list[str], problems: list[str]) -> None:
    """`--set vars.train=x.csv`, `--set steps.base.epochs=5`, `--set gate.acc=">= 0.9"`."""
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        where = f"--set {key}"
        if not sep or not key:
            problems.append(f"--set {item!r}: expected KEY=VALUE, e.g. vars.train=train.csv")
        elif parts[0] == "vars" and len(parts) == 2:
            table = raw.get("vars", {})
            if not isinstance(table, dict):
                problems.append(f"{where}: [vars] is not a table")
            elif parts[1] not in table:
                known = ", ".join(sorted(table)) or "none"
                problems.append(f"{where}: no variable {parts[1]!r} in [vars] (it has: {known})")
            else:
                table[parts[1]] = _typed_like(table[parts[1]], text, where, problems)
        elif parts[0] == "steps" and len(parts) == 3:
            steps = raw.get("steps")
            step = steps.get(parts[1]) if isinstance(steps, dict) else None
            if not isinstance(step, dict):
                tables = steps.items() if isinstance(steps, dict) else []
                known = ", ".join(n for n, t in tables if isinstance(t, dict))
                problems.append(f"{where}: no step {parts[1]!r} (steps: {known or 'none'})")
            elif parts[2] == "run":
                problems.append(f"{where}: a step's command cannot be overridden")
            else:  # the key the recipe already spells this option with, if any
                target = _option_key(step, parts[2])
                same = [k for k in step if k != "run" and _option_key(step, k) == target]
                name = parts[2] if parts[2] in step or not same else same[0]
                step[name] = _option_text(step, target, text)
        elif parts[0] == "gate" and len(parts) >= 2:  # metric keys have dots themselves
            gate = raw.setdefault("gate", {})
            if isinstance(gate, dict):
                gate[key.removeprefix("gate.")] = text
            else:
                problems.append(f"{where}: [gate] is not a table")
        else:
            problems.append(
                f"{where}: no such key (override vars.NAME, steps.STEP.OPTION or gate.METRIC)"
            )


def _option_key(step: dict[str, Any], key: str) -> str:
    """The option of the step's command that recipe key `key` sets."""
    run = step.get("run")
    return command(run).option_key(key) if run in STEP_COMMANDS else key


def _option_text(step: dict[str, Any], key: str, text: str) -> Any:
    """A `--set` value for a step option: a list for a repeatable option (comma-separated),
    else the text, which the check then reads as the option's type like any value."""
    run = step.get("run")
    param = command(run).params.get(key) if run in STEP_COMMANDS else None
    if param is not None and param.many:
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def _typed_like(current: Any, text: str, where: str, problems: list[str]) -> Any:
    """A `--set` variable arrives as text: read it as the type of the value it replaces
    (variables are scalars)."""
    if isinstance(current, bool):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        problems.append(f"{where}: expected true or false, got {text!r}")
    elif isinstance(current, int | float):
        try:
            return int(text) if re.fullmatch(r"[-+]?\d+", text.strip()) else float(text)
        except ValueError:
            problems.append(f"{where}: expected a number, got {text!r}")
    return text


# --- vars and steps -------------------------------------------------------------------------


def _variables(raw: Any, problems: list[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        problems.append("vars: must be a table of values")
        return {}
    for key, value in raw.items():
        if not isinstance(value, str | int | float | bool):
            problems.append(f"vars.{key}: must be a string, number or boolean")
    return dict(raw)


def _steps(
    raw: Any, variables: dict[str, Any], problems: list[str], deprecations: list[str]
) -> list[Step]:
    if not isinstance(raw, dict) or not raw:
        problems.append("steps: a recipe needs at least one [steps.NAME] table")
        return []
    steps: list[Step] = []
    for name, table in raw.items():
        where = f"steps.{name}"
        if not STEP_NAME.fullmatch(name):
            problems.append(
                f"{where}: a step name may hold letters, digits, '_' and '-' only "
                "(it is referenced as @name)"
            )
            continue
        if not isinstance(table, dict):
            problems.append(f"{where}: must be a table")
            continue
        run = table.get("run")
        if run in NOT_IN_RECIPES:
            problems.append(
                f"{where}.run: {run!r} writes no artifact, so it cannot be a recipe step "
                f"(run uqc {run} on an artifact the recipe built)"
            )
            continue
        if not isinstance(run, str) or run not in STEP_COMMANDS:
            problems.append(
                f"{where}.run: {'missing' if run is None else repr(run)}; name a step command: "
                f"{', '.join(STEP_COMMANDS)}"
            )
            continue
        cmd = command(run)
        step = Step(name=name, command=run, values={})
        options, written_as = _respelled(table, cmd, where, problems, deprecations)
        for key, value in options.items():
            written = written_as[key]
            if key in RESERVED:
                problems.append(f"{where}.{written}: set by the runner ({RESERVED[key]})")
                continue
            param = cmd.params.get(key)
            if param is None:
                known = ", ".join(cmd.spellings())
                problems.append(f"{where}.{written}: not an option of uqc {run} (options: {known})")
                continue
            if param.role and not param.many and isinstance(value, list) and len(value) > 1:
                problems.append(
                    f"{where}.{written}: uqc {run} takes one model, got {len(value)} "
                    '(write model = "@step"; one step per model, or fuse them first)'
                )
                continue
            expanded = _expand(value, variables, f"{where}.{written}", problems)
            checked = _check(expanded, param, f"{where}.{written}", problems)
            if checked is not None:
                step.values[key] = checked
        recipe_names = {v: k for k, v in cmd.spellings().items()}
        for param in cmd.params.values():
            if param.required and param.key not in options:
                shown = recipe_names.get(param.key, param.key)
                problems.append(f"{where}: missing {shown!r} (uqc {run} requires it)")
        steps.append(step)
    names = {s.name for s in steps} | {n for n in raw if isinstance(raw[n], dict)}
    for step in steps:
        for key, value in step.values.items():
            for ref in _refs(value):
                if ref.step not in names:
                    problems.append(
                        f"steps.{step.name}.{key}: @{ref.step} names no step "
                        f"(steps: {', '.join(raw)})"
                    )
                elif ref.step not in step.needs:
                    step.needs.append(ref.step)
    return steps


def _respelled(
    table: dict[str, Any], cmd: Any, where: str, problems: list[str], deprecations: list[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """A step table's keys as its command's options: the recipe vocabulary (`model` for
    the models a step reads, `members` only a count; `commands.Command.spellings`) and old
    spellings (with a line in `deprecations`) mapped to option keys, and a role its
    fallback key fills (prune's `scores` alone). Returns (value by option key, the key the
    recipe wrote for each); a key given twice under two spellings is a problem."""
    spelled, old = cmd.spellings(), cmd.old_spellings()
    options: dict[str, Any] = {}
    written_as: dict[str, str] = {}
    for key, value in table.items():
        if key == "run":
            continue
        if key not in spelled and key in old:
            role = next((r for r in cmd.roles if r.key == spelled[old[key]]), None)
            write = f"{old[key]} = ..."
            if role is not None and role.recipe_fallback:  # prune: usually its scores
                write = f"{role.recipe_fallback} = ..., or {old[key]} = ... with it"
            deprecations.append(
                f"{where}.{key}: '{key}' is the old spelling of '{old[key]}' "
                f"(accepted until the next release; write {write})"
            )
        target = spelled.get(old.get(key, key), key) if key not in spelled else spelled[key]
        if target in options:
            first = written_as[target]
            spelling = next((k for k, v in spelled.items() if v == target), target)
            problems.append(
                f"{where}.{first}: {first} and {key} are the same key (one input of uqc "
                f"{cmd.name}); give it once, as {spelling} = ..."
            )
            continue
        options[target], written_as[target] = value, key
    for role in cmd.roles:
        fallback = role.recipe_fallback
        if fallback and role.key not in options and spelled.get(fallback) in options:
            moved = spelled[fallback]
            options[role.key], written_as[role.key] = options.pop(moved), written_as.pop(moved)
    return options, written_as


def _expand(value: Any, variables: dict[str, Any], where: str, problems: list[str]) -> Any:
    """`${vars.x}` substituted; a value that is exactly one variable keeps its type."""
    if isinstance(value, list):
        return [_expand(v, variables, where, problems) for v in value]
    if not isinstance(value, str):
        return value
    for name in VARIABLE.findall(value):
        if name not in variables:
            known = ", ".join(variables) or "none"
            problems.append(f"{where}: ${{vars.{name}}} is not defined in [vars] ({known})")
            return value
    whole = VARIABLE.fullmatch(value)
    if whole:
        return variables[whole.group(1)]
    expanded = VARIABLE.sub(lambda m: _as_text(variables[m.group(1)]), value)
    if "${" in expanded:
        problems.append(f"{where}: {value!r} has a ${{...}} that is not ${{vars.NAME}}")
    return expanded


def _as_text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _check(value: Any, param: Param, where: str, problems: list[str]) -> Any:
    """The value as the option takes it, or None (with a problem recorded)."""
    if param.many:
        items = value if isinstance(value, list) else [value]
        if not items and param.required:
            problems.append(f"{where}: needs at least one value")
            return None
        checked = [_scalar(v, param, where, problems) for v in items]
        return None if any(c is None for c in checked) else checked
    if isinstance(value, list):
        if len(value) == 1:
            return _scalar(value[0], param, where, problems)
        joinable = all(
            isinstance(v, str | int | float) and not str(v).startswith("@") for v in value
        )
        if param.kind is str and joinable:
            options = [v for v in value if isinstance(v, str) and OPTION_LIKE.match(v)]
            if options:
                problems.append(_option_like(where, options[0]))
                return None
            return ",".join(str(v) for v in value)  # e.g. labels = ["neg", "pos"]
        problems.append(f"{where}: takes one value, got a list")
        return None
    return _scalar(value, param, where, problems)


def _scalar(value: Any, param: Param, where: str, problems: list[str]) -> Any:
    if isinstance(value, str) and value.startswith("@") and not REFERENCE.match(value):
        problems.append(f'{where}: {value!r}: a reference is "@name" alone, the whole value')
        return None
    if value == "-":
        problems.append(f"{where}: '-' (read stdin) has no meaning in a recipe; use \"@step\"")
        return None
    if param.kind is str and isinstance(value, str) and OPTION_LIKE.match(value):
        problems.append(_option_like(where, value))  # (a number's type check refuses it)
        return None
    ref = REFERENCE.match(value) if isinstance(value, str) else None
    if ref:
        if param.kind is not str:
            problems.append(f"{where}: @{ref.group(1)} is a path; this option takes a number")
            return None
        return Ref(ref.group(1))
    kind = param.kind
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"[-+]?\d+", value.strip()):
            return int(value)
    elif kind is float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if number is not None and not math.isfinite(number):
            # TOML has inf and nan; the step would refuse them only after earlier steps ran.
            problems.append(f"{where}: expected a finite number, got {value!r}")
            return None
        if number is not None:
            return number
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    problems.append(f"{where}: expected {names[kind]}, got {value!r}")
    return None


def _option_like(where: str, value: str) -> str:
    # A step runs as a command line: such a value would be read as an option of it (and
    # `out = "--out=/elsewhere"` would write wherever it says).
    return (
        f"{where}: {value!r} starts with '-' like a command-line option; a recipe value is "
        f'never an option (options are keys of the step; a file named so: "./{value}")'
    )


def _refs(value: Any) -> list[Ref]:
    items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, Ref)]


def _order(steps: list[Step], problems: list[str]) -> list[Step]:
    """File order, except that a step runs after every step it references; cycles refused."""
    by_name = {s.name: s for s in steps}
    done: list[Step] = []
    state: dict[str, str] = {}

    def visit(step: Step, path: list[str]) -> None:
        if state.get(step.name) == "done":
            return
        if state.get(step.name) == "visiting":
            cycle = [*path[path.index(step.name) :], step.name]
            problems.append(f"steps: {' -> '.join('@' + n for n in cycle)} form a cycle")
            return
        state[step.name] = "visiting"
        for need in step.needs:
            if need in by_name:
                visit(by_name[need], [*path, step.name])
        state[step.name] = "done"
        done.append(step)

    for step in steps:
        visit(step, [])
    return done


# --- gate -----------------------------------------------------------------------------------


def ood_name(spec: str) -> str:
    """The set name `eval` builds metric keys from: builtin name or file stem."""
    if spec.startswith("builtin:"):
        return spec.removeprefix("builtin:").partition("@")[0]
    return Path(spec).stem


def _gate(raw: Any, steps: list[Step], problems: list[str]) -> Gate | None:
    from uqcompress.uq.quality_gates import known_metrics, parse_gate

    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append('gate: must be a table of METRIC = ">= NUMBER" bounds')
        return None
    raw = _flatten(raw)
    evals = [s for s in steps if s.command == "eval"]
    eval_names = ", ".join(s.name for s in evals) or "none"
    step_name = raw.get("step", evals[-1].name if evals else None)
    gated = next((s for s in evals if s.name == step_name), None)
    if gated is None:
        problems.append(
            f"gate.step: {step_name!r} is not an eval step (eval steps: {eval_names})"
            if step_name is not None
            else "gate: bounds need an eval step to read metrics from; the recipe has none"
        )
        return None
    baseline = raw.get("baseline")
    if baseline is not None and not any(s.name == baseline for s in evals):
        problems.append(
            f"gate.baseline: {baseline!r} is not an eval step (eval steps: {eval_names})"
        )
        baseline = None
    ood = gated.values.get("ood", [])
    traits = _eval_traits(gated, {s.name: s for s in steps})
    known = known_metrics(
        [ood_name(str(s)) for s in ood],
        members=1 if traits.ensemble is False else 2,
        calibrated=traits.calibrated is not False,
        abstains=traits.abstains is not False,
    )
    known += list(RATIO_METRICS)
    bounds: list[Bound] = []
    for metric, text in raw.items():
        if metric in GATE_KEYS:
            continue
        where = f"gate.{metric}"
        if not isinstance(text, str):
            problems.append(f'{where}: write the bound as a string, e.g. ">= 0.95"')
            continue
        if "," in text:
            problems.append(f"{where}: one bound per key; write each metric as its own key")
            continue
        if metric in ("latency_ms", "latency_e2e_ms"):
            problems.append(f"{where}: latency is reported, never gated (noise on shared machines)")
            continue
        if metric in RATIO_METRICS and raw.get("baseline") is None:
            problems.append(f"{where}: a ratio needs gate.baseline (the eval step to divide by)")
            continue
        try:
            bounds += parse_gate(f"{metric}{text}", known)
        except ConfigError as exc:
            problems.append(f"{where}: {exc.message.removeprefix('--gate: ')}")
    return Gate(step=gated.name, baseline=baseline, bounds=bounds)


@dataclass(frozen=True)
class _Traits:
    """What an eval's model will be, as far as the recipe tells (None: cannot tell, e.g. a
    path from outside the recipe): so gates on metrics it cannot report fail before the run."""

    ensemble: bool | None
    calibrated: bool | None
    abstains: bool | None


_UNKNOWN = _Traits(None, None, None)
_ENSEMBLE_MAKERS = ("fuse", "svd-ensemble", "distill-director", "mc-dropout")


def _eval_traits(evaluation: Step, by_name: dict[str, Step]) -> _Traits:
    models = evaluation.values.get("models", [])
    if len(models) > 1:
        return _Traits(ensemble=True, calibrated=False, abstains=False)
    return _model_traits(models[0] if models else None, by_name, depth=0)


def _model_traits(value: Any, by_name: dict[str, Step], depth: int) -> _Traits:
    step = by_name.get(value.step) if isinstance(value, Ref) else None
    if step is None or depth > len(by_name):
        return _UNKNOWN
    source = step.values.get("model")
    if step.command == "calibrate":
        inner = _model_traits(source, by_name, depth + 1)
        return _Traits(inner.ensemble, True, "abstain_coverage" in step.values)
    # an export and its quantized copy keep what their model is, calibration included
    if step.command in ("export", "quantize"):
        return _model_traits(source, by_name, depth + 1)
    if step.command == "finetune":  # keeps ensembles, drops a calibration
        return _Traits(_model_traits(source, by_name, depth + 1).ensemble, False, False)
    if step.command in _ENSEMBLE_MAKERS:
        return _Traits(True, False, False)
    if step.command == "prune":
        return _Traits(int(step.values.get("members") or 1) > 1, False, False)
    if step.command == "init":
        return _Traits(False, False, False)
    return _UNKNOWN


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`ood.x.entropy.auroc = ">= 0.9"` without quotes is a nested TOML table: flatten it
    back into the dotted metric key."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
