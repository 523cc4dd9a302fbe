"""What every step config shares: which fields change results, and checking them all at once.

A config is a frozen dataclass. Fields that do not change the artifact (where or how fast it
runs, and how data was *named*: the data's content fingerprints are in the id instead) are
marked `runtime` in the dataclass itself; `id_config` leaves them out of the artifact id.

A field may also say how the command line and recipes spell it (`option`, when the option
is not the field: `--freeze-head` sets `train_head`), what type the option takes (`kind`, when
it is not the field's: `--labels a,b` is one string) and how to read it into the field
(`parse`), and its default as an option where it differs (`option_default`: `--device auto`
where a config built in code runs on the CPU).

A field also carries its option's `help` (the CLI commands are generated from the configs:
`cli/commands.py`); options every step shares (`--batch-size`, `--seed`, the training
options...) take theirs from `cli/options.py` unless the field says otherwise. `decl` spells
an option whose flag is not the key's (`--per-channel/--per-tensor`), and `cli_default` is the
option's value when absent where a `parse` turns it into the field (`--freeze-head`: False).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from uqcompress.errors import Problems
from uqcompress.runtime.limits import bound_problems

RUNTIME = "runtime"
HELP = "help"  # the option's --help text (a field without one takes the shared option's)
ID_OMIT = "id_omit"  # the value at which a field is left out of the id (it was added later)
CHOICES = "choices"  # the values a text option takes; `problems` refuses any other


def runtime(default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A field that does not change the result: kept out of the artifact id."""
    return dataclasses.field(default=default, metadata={RUNTIME: True, **metadata})


def device(option_default: str = "auto") -> Any:
    """`--device`: resolved before the step runs (auto: cuda if visible, else cpu)."""
    return runtime("cpu", option_default=option_default)


def threads() -> Any:
    """`--threads`: resolved before the step runs (None: 1, or $UQC_THREADS)."""
    return runtime(1, option_default=None)


def workers() -> Any:
    """`--workers`: data-loader worker processes; the results never depend on it."""
    return runtime(0)


def dtype(also: str = "") -> Any:
    """`--dtype`: the dtype the model is loaded and computed in (`models.precision`); `auto`
    is resolved when the step plans its artifact, and float32 (what every step computed in
    before the option) is left out of the id. `also`: what the dtype means besides that in
    one step (finetune), said after the shared help."""
    from uqcompress.models.precision import DTYPE_HELP, DTYPES

    help_text = f"{DTYPE_HELP} {also}".strip()
    return dataclasses.field(
        default="auto",
        metadata={RUNTIME: False, ID_OMIT: "float32", HELP: help_text, CHOICES: DTYPES},
    )


def described(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Any = dataclasses.MISSING,
    **metadata: Any,
) -> Any:
    """A field that changes the result, with its option's help text."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(
            default_factory=default_factory, metadata={RUNTIME: False, HELP: help, **metadata}
        )
    return dataclasses.field(default=default, metadata={RUNTIME: False, HELP: help, **metadata})


def option(
    default: Any = dataclasses.MISSING,
    *,
    name: str | None = None,
    kind: Any = None,
    parse: Callable[[Any], Any] | None = None,
    is_runtime: bool = False,
    default_factory: Any = dataclasses.MISSING,
    **extra: Any,
) -> Any:
    """A field whose option differs from it: another name, type or reading (`extra`: more
    metadata, e.g. `help`)."""
    metadata: dict[str, Any] = {RUNTIME: is_runtime, **extra}
    if name is not None:
        metadata["option"] = name
    if kind is not None:
        metadata["kind"] = kind
    if parse is not None:
        metadata["parse"] = parse
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def added(default: Any, omit: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A field that changes the result but was added after artifacts were made without it:
    at `omit` (default: `default`), the behaviour from before, it is left out of the id, so
    those artifacts keep their ids."""
    value = default if omit is dataclasses.MISSING else omit
    return dataclasses.field(default=default, metadata={RUNTIME: False, ID_OMIT: value, **metadata})


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingOptions:
    """The options of every training step (finetune, svd-ensemble, distill-director) beyond
    epochs, lr and batch size; `engine.train.TrainConfig.of` reads them.

    `select_best` None means nll with `--val` and none without (`resolve_training` records
    which); `warmup` is a fraction of the optimizer steps; `ema` None trains without a
    weight average; `checkpoint_every` and `resume`
    change where a run may stop and go on, never its result.
    """

    select_best: str | None = added(None, omit="none")
    patience: int | None = added(None)
    grad_accum: int = added(1)
    max_steps: int | None = added(None)
    schedule: str = added("linear")
    warmup: float = added(0.1)
    optimizer: str = added("adamw")
    ema: float | None = added(None)
    ema_every: int = added(1)
    ema_start: int = added(0)
    checkpoint_every: int | None = runtime(None)
    resume: bool = runtime(False)
    augment: str = added("none")
    workers: int = runtime(0)
    fsdp: bool = runtime(
        False,
        help="Under torchrun or accelerate launch: shard the weights, gradients and optimizer "
        "state across the processes (FSDP), for a model that does not fit one. An accelerate "
        "config with distributed_type FSDP turns it on too. Same result as data-parallel.",
    )


def resolve_training(cfg: Any) -> Any:
    """The training config with `select_best` as the run uses it (nll with `--val`, none
    without), so that the manifest records it."""
    if getattr(cfg, "select_best", "none") is not None:
        return cfg
    return dataclasses.replace(cfg, select_best="nll" if cfg.val is not None else "none")


def runtime_keys(cfg: Any) -> frozenset[str]:
    """The names of the fields of `cfg` that do not change results."""
    return frozenset(f.name for f in dataclasses.fields(cfg) if f.metadata.get(RUNTIME))


def id_config(cfg: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """What goes into the artifact id: the recorded config (default: every field of `cfg`)
    without the runtime fields of `cfg`."""
    recorded = dataclasses.asdict(cfg) if config is None else config
    skip = runtime_keys(cfg)
    omit = {f.name: f.metadata[ID_OMIT] for f in dataclasses.fields(cfg) if ID_OMIT in f.metadata}
    return {
        k: v
        for k, v in recorded.items()
        if k not in skip and not (k in omit and v == omit[k] and type(v) is type(omit[k]))
    }


def flag(name: str) -> str:
    """The command-line flag of a field: `--sigma-init` for `sigma_init`."""
    return "--" + name.replace("_", "-")


def non_finite(cfg: Any) -> Problems:
    """NaN and infinities in float fields. Python's float() accepts 'nan', 'inf' and
    '-infinity', and no range check catches them (`nan < 0` and `nan > 1` are both False), so
    such a value would pass validation and fail later under another option's name."""
    problems = Problems()
    for field in dataclasses.fields(cfg):
        values = getattr(cfg, field.name)
        for number in values if isinstance(values, list | tuple) else (values,):
            if isinstance(number, float) and not math.isfinite(number):
                name = flag(field.metadata.get("option", field.name))
                default = field.default
                example = (
                    f", e.g. {name} {default:g} (the default)" if isinstance(default, float) else ""
                )
                problems.add(
                    f"{name} {number} is not a finite number",
                    hint=f"pass a finite number to {name}{example}",
                )
    return problems


def problems(cfg: Any) -> Problems:
    """Start checking a config: non-finite numbers are raised at once (nothing else about
    them is meaningful); the returned collector takes the config's own problems, and
    `raise_any()` raises them all together."""
    found = non_finite(cfg)
    found.raise_any()
    for field in dataclasses.fields(cfg):
        value, choices = getattr(cfg, field.name), field.metadata.get(CHOICES)
        name = flag(field.metadata.get("option", field.name))
        if choices is not None and value not in choices:
            found.add(
                f"{name} {value!r} is not one of {', '.join(choices)}",
                hint=f"pass {name} {choices[0]}",
            )
        out_of_bounds = bound_problems(field.name, value, name, field.default)  # runtime/limits
        if out_of_bounds is not None:
            found.add(out_of_bounds[0], hint=out_of_bounds[1])
    return found
