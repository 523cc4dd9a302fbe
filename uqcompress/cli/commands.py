"""The step commands, generated from the step registry: `uqc STEP` takes the step's input roles
as arguments (or, like prune's --scores, as options) and one option per config field, then
--out, --force and --json (a step that writes no artifact, predict: --out FILE and --force,
no --json); its body runs the step through `cli/invoke.run_step`.

An option's type, default and whether it is required come from the config field; its help
from the field's `help` metadata or, for the options every step shares, from
`cli/options.SHARED`. So a new config field is a command-line option (and a recipe key) with
nothing else to write. Commands that do more than run one step (`run`, `demo`,
`inspect`, `verify`) are written by hand beside this module.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from uqcompress.cli.options import (
    SHARED,
    DryRun,
    Force,
    ForceFile,
    Json,
    Out,
    OutFile,
    Quiet,
    Verbose,
    resolve_input,
)
from uqcompress.errors import ConfigError
from uqcompress.steps.config import HELP as FIELD_HELP
from uqcompress.steps.registry import Option, Step, step

# Each generated command's help (its first line is the summary `uqc --help` lists).
HELP: dict[str, str] = {
    "init": """
    Create an untrained model artifact from a transformers config (no download).
    """,
    "import": """
    Import a transformers model directory (weights, config, tokenizer or image processor) or a
    GGUF file (Llama, Mistral, Qwen2, Qwen3; dequantized to float32).
    """,
    "finetune": """
    Fine-tune a classifier (--optimizer, warm-up then --schedule) and write a new model artifact;
    with --val, the best epoch's weights (--select-best) and a history of every epoch.
    """,
    "eval": """
    Evaluate and write an eval artifact (metrics.json); prints a table on stderr. An
    ensemble (M > 1: several models, Hydra, SVE, DIRECTOR samples) also reports the test-set
    means of predictive entropy, aleatoric entropy and mutual information.
    """,
    "score": """
    Score every attention head ([L, H], higher = keep); pipe into uqc prune.

    A pruned model is scored for the heads it has now: H is its largest layer's head count,
    and a layer with fewer heads has NaN in the slots it lacks.
    """,
    "prune": """
    Prune attention heads; writes a smaller model artifact that eval/finetune/export take.
    """,
    "fuse": """
    Fuse pruned members into one Hydra model: one forward pass, M member predictions.

    The result is a model artifact that finetune (mean of member cross-entropies), eval (as
    an ensemble) and export (member_logits [B, M, C]) take like any model.
    """,
    "svd-ensemble": """
    Build and train a Singular Value Ensemble: each target W = U S V^T keeps U, V frozen;
    every member learns its own singular values, biases and head (mean of member
    cross-entropies, every member sees every batch). Post hoc on a fine-tuned classifier
    (members start from its head), or as fine-tuning from a pretrained backbone (--heads
    fresh: new, differently initialised heads).
    """,
    "distill-director": """
    Distil the teacher's blocks into one time-conditioned DiT transition that samples:
    S roll-outs per input, averaged, for calibrated uncertainty.
    """,
    "mc-dropout": """
    Make an MC Dropout model: the classifier's weights, run S times with dropout kept on
    at inference (embeddings, attention and MLP outputs, BERT's classifier input; attention
    probabilities not), the S softmaxes averaged. Each example's masks come from the seed and
    its content, so its prediction does not depend on its batch; eval treats the samples as
    members, and export takes the draws as the graph input `noise` (bert and vit families).
    """,
    "calibrate": """
    Fit a temperature (every member's logits / T, T minimising the NLL of the averaged
    probabilities by L-BFGS) and write a new model artifact that eval, export (in the graph),
    predict and the Predictor apply. Reports NLL and ECE before/after.
    """,
    "export": """
    Export a model; ONNX must match PyTorch on real batches or nothing is written (exit 3).
    """,
    "quantize": """
    Quantize an ONNX export; written only if it stays within the drift gate against the
    float32 export (exit 3 and nothing written otherwise).
    """,
    "predict": """
    Predict: label, probs (by label), entropy and mutual_info per example, as JSONL.

    ONNX artifacts run on the torch-free ONNX Runtime Predictor; models run in torch. A model
    calibrated with an abstention rule (uqc calibrate --abstain-coverage) adds
    "abstain": true|false. Records are written batch by batch (memory does not grow with the
    number of examples) and appear only when all are written: nothing on a failure. Under
    torchrun each process predicts a shard; the first writes every record, in order.
    """,
    "compare": """
    Compare evaluations: accuracy, NLL, ECE, Brier, AURC, an ensemble's mean entropy,
    aleatoric entropy and MI, OOD AUROC/FPR95/AUPR, parameters, latency and its ratio to a
    baseline. Prints the table on stderr; the artifact holds
    comparison.md / .csv / .json and comparison.png (reliability and OOD histograms).
    """,
}


def _option_type(option: Option, optional: bool) -> Any:
    """The Python type Typer reads an option as: `int`, `list[str]`, `float | None`..."""
    base: Any = list[option.kind] if option.many else option.kind  # type: ignore[name-defined]
    return base | None if optional else base


def _role_parameter(role: Any, option: Option) -> inspect.Parameter:
    optional = not role.required
    kind = _option_type(option, optional)
    if role.flag is None:
        info: Any = typer.Argument(help=role.help, metavar=role.metavar, show_default=False)
    else:
        info = typer.Option(role.flag, help=role.help, show_default=False)
    default = None if optional else inspect.Parameter.empty
    return inspect.Parameter(
        role.key, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, info], default=default
    )


def _field_parameter(spec: Step, option: Option) -> inspect.Parameter:
    field = next(f for f in dataclasses.fields(spec.config) if f.name == option.field)
    meta = field.metadata
    if "cli_default" in meta:
        default: Any = meta["cli_default"]
    elif "option_default" in meta:
        default = meta["option_default"]
    elif field.default_factory is not dataclasses.MISSING:
        default = None  # a list option given no times
    elif field.default is dataclasses.MISSING:
        default = inspect.Parameter.empty  # required
    else:
        default = field.default
    help_text = meta.get(FIELD_HELP)
    if help_text is None:
        if option.key not in SHARED:
            raise TypeError(f"uqc {spec.name}: option {option.flag} has no help (steps/config.py)")
        annotation: Any = SHARED[option.key]
    else:
        kind = _option_type(option, optional=default is None)
        info = typer.Option(
            meta.get("decl", option.flag), help=help_text, show_default=default is not None
        )
        annotation = Annotated[kind, info]
    return inspect.Parameter(
        option.key, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def _keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


# How every step command runs and talks: plan only, and how much it says on stderr.
_HOW = (
    _keyword("dry_run", DryRun, False),
    _keyword("verbose", Verbose, False),
    _keyword("quiet", Quiet, False),
)
_COMMON = (
    _keyword("out", Out, None),
    _keyword("force", Force, False),
    _keyword("json_out", Json, False),
    *_HOW,
)
# A step that writes no artifact (predict): --out is the file it writes; no --json.
_FILE = (_keyword("out", OutFile, None), _keyword("force", ForceFile, False), *_HOW)


_LAST = ("device", "threads")  # where it runs: after what it does


def _field_order(config: type) -> list[str]:
    """The config's fields as --help lists them: its own in declaration order, then those it
    inherits (the shared training options), then --device and --threads."""
    inherited = {
        f.name
        for base in config.__mro__[1:]
        if dataclasses.is_dataclass(base)
        for f in dataclasses.fields(base)
    }
    names = [f.name for f in dataclasses.fields(config)]
    own = [n for n in names if n not in inherited and n not in _LAST]
    return (
        own
        + [n for n in names if n in inherited and n not in _LAST]
        + [n for n in _LAST if n in names]
    )


def _parameters(spec: Step) -> list[inspect.Parameter]:
    """Arguments (the positional input roles) first, then the input options (prune --scores),
    the config's options and --out, --force and --json (predict: --out FILE and --force)."""
    roles = {r.key: r for r in spec.inputs}
    options = spec.options()
    inputs = [o for o in options.values() if o.role]
    by_field = {o.field: o for o in options.values() if o.field is not None}
    return [
        *(_role_parameter(roles[o.key], o) for o in inputs if o.flag is None),
        *(_role_parameter(roles[o.key], o) for o in inputs if o.flag is not None),
        *(_field_parameter(spec, by_field[name]) for name in _field_order(spec.config)),
        *(_COMMON if spec.writes_artifact else _FILE),
    ]


def _resolve_inputs(spec: Step, values: dict[str, Any]) -> None:
    """Positional input paths with '-' read from stdin (one path: stdin holds one line)."""
    for role in spec.inputs:
        value = values.get(role.key)
        if role.flag is not None or value is None:
            continue
        if role.many:
            if list(value).count("-") > 1:
                raise ConfigError(
                    f"'-' can stand for only one of the {role.key}", hint="name the others by path"
                )
            values[role.key] = [resolve_input(v) for v in value]
        else:
            values[role.key] = resolve_input(value)


def step_command(name: str) -> Callable[..., None]:
    """The Typer callback of `uqc NAME`: its signature is built from the step's options."""
    spec = step(name)

    def command(**values: Any) -> None:
        from uqcompress.cli.invoke import plan_step, run_step

        out, force = values.pop("out"), values.pop("force")
        json_out = values.pop("json_out", False)
        dry_run = values.pop("dry_run")
        values.pop("verbose"), values.pop("quiet")  # already applied as they were parsed
        _resolve_inputs(spec, values)
        if dry_run:
            plan_step(name, values, force, json_out, out)
        else:
            run_step(name, values, force, json_out, out)

    parameters = _parameters(spec)
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    command.__doc__ = HELP[name]
    command.__name__ = command.__qualname__ = name.replace("-", "_")
    return command
