"""Every step, declared once: its name, config dataclass, input roles, how to run it and how to
plan it. The CLI commands, `uqc run` and `uqc demo` all go through here.

A step's *options* (what `uqc STEP --flag` and a recipe's keys may say) are its input roles,
its config's fields and `out`; a field says in its metadata when its option is spelled or typed
otherwise (`steps/config.py`). So a new config field is an option of the recipes at once, and
its checks (`validate()`, non-finite numbers included) are the same wherever the step runs.

The step modules are imported only when a step is looked at, so importing this module costs
nothing (`uqc --help` imports no step, and no step module imports torch at its top).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from uqcompress.steps.common import StepResult

OUT = "out"  # every step's output folder option


@dataclass(frozen=True)
class Role:
    """An input of a step: artifact (or transformers directory) paths it reads."""

    key: str  # the CLI argument name and the step's own name for it: "model", "models"
    many: bool = False  # several paths (a variadic argument)
    required: bool = True
    flag: str | None = None  # given as an option (prune --scores); None: a positional argument
    help: str = "Model artifact or transformers dir ('-': stdin)."  # the argument's --help
    metavar: str | None = None  # as --help names it (default: the key in capitals)
    # What a recipe calls it, when not `key`: one vocabulary across steps (`model` is the
    # model or models a step reads; `members` is only ever a count). `key` is then an old
    # spelling, accepted with a deprecation line for one release.
    recipe_key: str | None = None
    # A recipe key that fills this role when the recipe does not name it: prune's `scores`
    # alone is its input (the model comes from the scores' lineage).
    recipe_fallback: str | None = None

    @property
    def recipe_name(self) -> str:
        return self.recipe_key or self.key


@dataclass(frozen=True)
class Option:
    """One thing a command line or a recipe step may say, typed."""

    key: str  # the recipe key: "batch_size", "model", "out"
    flag: str | None  # "--batch-size"; None for a positional argument
    kind: type  # int, float, str or bool (paths are str)
    many: bool  # a list: repeatable option or variadic argument
    required: bool
    field: str | None = None  # the config field it sets; None for an input role or `out`
    role: bool = False  # an input path


@dataclass(frozen=True)
class Plan:
    """Where a step's artifact would go, and whether an artifact with its id is there (a step
    that writes no artifact, predict: `dest` is its --out file or None for stdout, `kind`
    "predictions", `id` empty, `examples` the records it would write). `config`: the resolved
    config it would run with (device and threads resolved)."""

    dest: Path | None
    reusable: bool
    kind: str
    id: str
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    examples: int | None = None


# None: a step that writes no artifact (predict)
Call = Callable[[Any, dict[str, Any], Any, Path | None, bool], StepResult | None]


@dataclass(frozen=True)
class Step:
    name: str  # the CLI command and recipe `run` value
    module: str  # where its config and run live: "uqcompress.steps.finetune"
    config_name: str  # the config dataclass in that module
    inputs: tuple[Role, ...]
    # (step module, inputs by role key, config, out, force) -> result: the module's own run
    call: Call
    # a module function that judges a written artifact (eval: its --gate), raising if it fails
    verdict_name: str | None = None
    # False: the step writes a file or stdout, not an artifact (predict): its `out` is a file,
    # it has no --json, no plan and no place in a recipe
    writes_artifact: bool = True

    def step_module(self) -> Any:
        return importlib.import_module(self.module)

    @property
    def config(self) -> type:
        cls: type = getattr(self.step_module(), self.config_name)
        return cls

    def options(self) -> dict[str, Option]:
        return _options(self)

    # --- from options to a config ---------------------------------------------------------

    def configure(self, values: dict[str, Any]) -> Any:
        """The config for option values by key (flags already typed, as Typer or the recipe
        check give them); options not given take their option default."""
        kwargs: dict[str, Any] = {}
        by_field = {f.name: f for f in dataclasses.fields(self.config)}
        for option in self.options().values():
            if option.field is None:
                continue
            field = by_field[option.field]
            if option.key in values:
                value = values[option.key]
                parse = field.metadata.get("parse")
                kwargs[field.name] = parse(value) if parse is not None else value
            elif "option_default" in field.metadata:
                kwargs[field.name] = field.metadata["option_default"]
        unknown = set(values) - set(self.options())
        if unknown:  # a caller's mistake, not a user's: the CLI and the recipe check know
            raise TypeError(f"uqc {self.name} has no option {', '.join(sorted(unknown))}")
        return self.config(**kwargs)

    def inputs_of(self, values: dict[str, Any]) -> dict[str, Any]:
        """Input paths by role key: Path, a list of Path, or None (an optional role absent)."""
        found: dict[str, Any] = {}
        for role in self.inputs:
            value = values.get(role.key)
            if value is None:
                found[role.key] = [] if role.many else None
            elif role.many:
                found[role.key] = [Path(v) for v in value]
            else:
                found[role.key] = Path(value)
        return found

    # --- running --------------------------------------------------------------------------

    def run(
        self,
        inputs: dict[str, Any],
        cfg: Any,
        out: Path | None = None,
        force: bool = False,
        root: Path | None = None,
    ) -> StepResult | None:
        """Check the config (every problem at once), resolve its device and threads, and run
        the step: reuse an artifact with the same id, else build it (None: a step that writes
        no artifact, predict). `root`: where an artifact without `out` goes (default:
        $UQC_ARTIFACTS or ./artifacts)."""
        from uqcompress.artifacts.writer import artifacts_root
        from uqcompress.runtime.console import detail, is_verbose, phase
        from uqcompress.runtime.planning import is_planning

        cfg.validate()  # every problem at once, before any input is read
        cfg = _with_compute(cfg)
        # A dry run stops by raising its plan, which is no failure to time; it prints the
        # config itself.
        timed = contextlib.nullcontext() if is_planning() else phase(f"uqc {self.name}")
        if is_verbose() and not is_planning():
            detail(f"uqc {self.name}: {config_line(cfg)}")
        with artifacts_root(root), timed:
            return self.call(self.step_module(), inputs, cfg, out, force)

    def plan(
        self,
        inputs: dict[str, Any],
        cfg: Any,
        out: Path | None = None,
        force: bool = False,
        root: Path | None = None,
    ) -> Plan:
        """What `run` would write, without writing, building or downloading anything: the
        step checks its inputs and computes its id as usual, then stops where work starts."""
        from uqcompress.runtime.planning import PlannedPrediction, PlannedStep, planning

        cfg.validate()
        config = resolved_config(cfg)
        try:
            with planning():
                self.run(inputs, cfg, out, force, root)
        except PlannedStep as planned:
            recorded = _json_ready(planned.config or {})  # what the step itself resolved
            config = {**config, **{k: v for k, v in recorded.items() if k in config}}
            return Plan(planned.dest, planned.reusable, planned.kind, planned.id, config)
        except PlannedPrediction as predicted:
            return Plan(out, False, "predictions", "", config, predicted.examples)
        raise RuntimeError(f"step {self.name} ran instead of planning")  # skipped the plan

    def execute(
        self, values: dict[str, Any], force: bool = False, root: Path | None = None
    ) -> StepResult | None:
        """`run` from option values by key (input roles, config options and `out`)."""
        inputs, cfg, out = self.prepare(values)
        return self.run(inputs, cfg, out, force, root)

    def prepare(self, values: dict[str, Any]) -> tuple[dict[str, Any], Any, Path | None]:
        """(inputs, config, out) from option values by key."""
        roles = {r.key for r in self.inputs}
        inputs = self.inputs_of(values)
        out = values.get(OUT)
        options = {k: v for k, v in values.items() if k not in roles and k != OUT}
        return inputs, self.configure(options), Path(out) if out is not None else None

    def verdict(self, result: StepResult) -> None:
        """Raise if the written artifact fails the step's own check (eval --gate: exit 3)."""
        if self.verdict_name is not None:
            getattr(self.step_module(), self.verdict_name)(result)


def resolved_config(cfg: Any) -> dict[str, Any]:
    """The config's fields as the step would run with them (device and threads resolved),
    JSON-ready (paths as text)."""
    return _fields(_with_compute(cfg))


def _fields(cfg: Any) -> dict[str, Any]:
    return _json_ready(dataclasses.asdict(cfg))


def _json_ready(values: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}


def config_line(resolved: Any) -> str:
    """An already resolved config (as `run` holds it) on one line, `key=value` (markup-safe),
    for -v."""
    from uqcompress.runtime.console import user

    return " ".join(f"{k}={user(v)}" for k, v in _fields(resolved).items())


def _with_compute(cfg: Any) -> Any:
    """The config with its device resolved (auto: cuda if visible, else cpu) and its torch
    threads set, as the step will run."""
    names = {f.name for f in dataclasses.fields(cfg)}
    if "device" not in names:
        return cfg
    from uqcompress.runtime.device import configure_threads, resolve_device

    return replace(cfg, device=resolve_device(cfg.device), threads=configure_threads(cfg.threads))


@cache
def _options(step: Step) -> dict[str, Option]:
    options: dict[str, Option] = {}
    for role in step.inputs:
        options[role.key] = Option(
            key=role.key,
            flag=role.flag,
            kind=str,
            many=role.many,
            required=role.required,
            role=True,
        )
    config = step.config
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        key = field.metadata.get("option", field.name)
        kind, many = _base_type(field.metadata.get("kind", hints[field.name]))
        required = (
            field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
            and "option_default" not in field.metadata
        )
        options[key] = Option(
            key=key,
            flag="--" + key.replace("_", "-"),
            kind=kind,
            many=many,
            required=required,
            field=field.name,
        )
    options[OUT] = Option(key=OUT, flag="--out", kind=str, many=False, required=False)
    return options


def _base_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, is a list) of a field's type, Optional stripped; paths are str."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _base_type(inner[0])
    if origin is list:
        return _base_type(typing.get_args(hint)[0])[0], True
    if hint in (int, float, bool):
        return hint, False
    return str, False


# --- the steps ------------------------------------------------------------------------------

MODEL = (Role("model"),)


def _one(module: Any, inputs: dict[str, Any], cfg: Any, out: Path | None, force: bool) -> Any:
    """A step of one model: finetune, score, svd-ensemble, distill-director, mc-dropout,
    calibrate, export, quantize."""
    return module.run(inputs["model"], cfg, out, force)


def _predict(module: Any, inputs: dict[str, Any], cfg: Any, out: Path | None, force: bool) -> None:
    """predict: the records in `out` or on stdout; no artifact, so no result."""
    module.run(inputs["model"], cfg, out, force)


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(
            "init",
            "uqcompress.steps.init",
            "InitConfig",
            (),
            lambda m, i, cfg, out, force: m.run(cfg, out, force),
        ),
        Step(
            "import",
            "uqcompress.steps.import_",
            "ImportConfig",
            (
                Role(
                    "source",
                    help="A transformers save_pretrained directory, a GGUF file (.gguf; "
                    "needs the gguf extra), or a Hugging Face Hub id (org/name, downloaded "
                    "when online) ('-' reads stdin).",
                ),
            ),
            lambda m, i, cfg, out, force: m.run(
                i["source"], out, force, cfg.trust_remote_code, cfg.dtype
            ),
        ),
        Step("finetune", "uqcompress.steps.finetune", "FinetuneConfig", MODEL, _one),
        Step("score", "uqcompress.steps.score", "ScoreConfig", MODEL, _one),
        Step(
            "prune",
            "uqcompress.steps.prune",
            "PruneConfig",
            (
                Role(
                    "input",
                    help="A scores artifact (its model is found through its lineage), or a "
                    "model with --scores ('-': stdin).",
                    metavar="INPUT",
                    recipe_key="model",
                    recipe_fallback="scores",
                ),
                Role(
                    "scores",
                    required=False,
                    flag="--scores",
                    help="Scores artifact, when INPUT is a model.",
                ),
            ),
            lambda m, i, cfg, out, force: m.run(i["input"], cfg, i.get("scores"), out, force),
        ),
        Step(
            "fuse",
            "uqcompress.steps.fuse",
            "FuseConfig",
            (
                Role(
                    "members",
                    many=True,
                    help="A members artifact (uqc prune --members M), or several pruned model "
                    "artifacts of one base ('-': read one path from stdin).",
                    metavar="MEMBERS...",
                    recipe_key="model",
                ),
            ),
            lambda m, i, cfg, out, force: m.run(i["members"], cfg, out, force),
        ),
        Step(
            "svd-ensemble",
            "uqcompress.steps.sve",
            "SVEConfig",
            (
                Role(
                    "model",
                    help="A fine-tuned model artifact or transformers dir, or a pretrained "
                    "backbone with --heads fresh ('-': stdin).",
                ),
            ),
            _one,
        ),
        Step(
            "distill-director",
            "uqcompress.steps.director",
            "DirectorConfig",
            (Role("model", help="The teacher: a fine-tuned model artifact or transformers dir."),),
            _one,
        ),
        Step(
            "mc-dropout",
            "uqcompress.steps.mc_dropout",
            "MCDropoutConfig",
            (Role("model", help="A fine-tuned model artifact or transformers dir ('-': stdin)."),),
            _one,
        ),
        Step("calibrate", "uqcompress.steps.calibrate", "CalibrateConfig", MODEL, _one),
        Step("export", "uqcompress.steps.export", "ExportConfig", MODEL, _one),
        Step(
            "quantize",
            "uqcompress.steps.quantize",
            "QuantizeConfig",
            (Role("model", help="ONNX artifact written by uqc export ('-': stdin)."),),
            _one,
        ),
        Step(
            "eval",
            "uqcompress.steps.eval",
            "EvalConfig",
            (
                Role(
                    "models",
                    many=True,
                    help="One model, or several for a deep ensemble ('-': read one path from "
                    "stdin).",
                    recipe_key="model",
                ),
            ),
            lambda m, i, cfg, out, force: m.run(i["models"], cfg, out, force),
            verdict_name="check_gate",
        ),
        Step(
            "predict",
            "uqcompress.steps.predict",
            "PredictConfig",
            (
                Role(
                    "model", help="Model artifact, transformers dir or ONNX artifact ('-': stdin)."
                ),
            ),
            _predict,
            writes_artifact=False,
        ),
        Step(
            "compare",
            "uqcompress.steps.compare",
            "CompareConfig",
            (
                Role(
                    "evals",
                    many=True,
                    help="Eval artifacts (uqc eval) of the same test data.",
                    metavar="EVAL...",
                ),
            ),
            lambda m, i, cfg, out, force: m.run(i["evals"], cfg, out, force),
        ),
    )
}


def step(name: str) -> Step:
    """The step `name` (its CLI command name); KeyError if there is none."""
    return STEPS[name]
