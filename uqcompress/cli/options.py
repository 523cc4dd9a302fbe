"""Options shared by every step: same names, same help, same defaults everywhere."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from uqcompress.errors import ConfigError

Out = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Output artifact directory. Default: artifacts/<kind>-<id8> "
        "(or $UQC_ARTIFACTS/<kind>-<id8>).",
        show_default=False,
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace the artifact --out holds (never a folder that is not an artifact)."
    ),
]
# --out and --force of a step that writes one file, not an artifact (predict)
OutFile = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Write the JSONL to this file (built beside it batch by batch, renamed into "
        "place when complete) and print its path, instead of the JSONL on stdout.",
        show_default=False,
    ),
]
ForceFile = Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")]


def _verbosity_setter(level: str, other: str) -> Callable[[typer.Context, bool], bool]:
    """The callback of -v or -q: sets the verbosity `level` names (runtime.console) when the
    flag is given, and refuses it beside the `other` one."""

    def set_level(ctx: typer.Context, value: bool) -> bool:
        from uqcompress.runtime import console

        if value:
            if ctx.params.get(other):
                raise typer.BadParameter("-v/--verbose and -q/--quiet exclude each other")
            console.set_verbosity(getattr(console, level))
        return value

    return set_level


# Set as they are parsed (eager), so they hold before the command body, whatever it is.
Verbose = Annotated[
    bool,
    typer.Option(
        "-v",
        "--verbose",
        help="Also print each phase of the work and its cost (resolved config, inputs, time).",
        callback=_verbosity_setter("VERBOSE", other="quiet"),
        is_eager=True,
    ),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "-q",
        "--quiet",
        help="Print nothing on stderr but errors: no progress, tables or warnings (warnings "
        "stay in the manifest). stdout is unchanged.",
        callback=_verbosity_setter("QUIET", other="verbose"),
        is_eager=True,
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Check the inputs and options and print the plan (resolved config, the artifact "
        "id, its path, and whether it would be built or reused). Writes nothing.",
    ),
]
Json = Annotated[
    bool,
    typer.Option("--json", help="Print the result as JSON on stdout instead of the path."),
]
Device = Annotated[
    str,
    typer.Option("--device", help="auto (cuda if visible, else cpu), cpu, cuda or cuda:N."),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="CPU threads for torch, at most 4 x the CPU cores. Default: 1, or $UQC_THREADS "
        "(on 2 cores 1 thread trained as fast as 2 on average and steadier; see "
        "benchmarks/train_threads.py).",
        show_default=False,
    ),
]
Seed = Annotated[int, typer.Option("--seed", help="Random seed.")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Examples per batch.")]
MaxLength = Annotated[
    int | None,
    typer.Option(
        "--max-length",
        help="Truncate text to this many tokens. Default: the model's limit.",
        show_default=False,
    ),
]
TextColumn = Annotated[
    str, typer.Option("--text-column", help="Text column of table data (files, save_to_disk, hf:).")
]
TextPairColumn = Annotated[
    str | None,
    typer.Option(
        "--text-pair-column",
        help="Second text column of pair tasks (e.g. sentence2, with --text-column sentence1): "
        "each example is the tokenizer's pair input. Default: single texts.",
        show_default=False,
    ),
]
LabelColumn = Annotated[
    str,
    typer.Option("--label-column", help="Label column of table data (files, save_to_disk, hf:)."),
]
WeightDecay = Annotated[
    float,
    typer.Option(
        "--weight-decay",
        help="Weight decay, 0 or more (0 turns it off): decoupled with adamw, an L2 term in "
        "the gradient with adam and sgd; on weight matrices only, never on biases, norm "
        "weights or SVE singular values.",
    ),
]


def resolve_input(value: str) -> Path:
    """An input path, where '-' reads the path from the first line of stdin."""
    if value != "-":
        return Path(value)
    hint = "pipe a step's output in, e.g. uqc init ... | uqc finetune - --data D"
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError("'-' reads the input path from stdin, but stdin is a terminal", hint=hint)
    text = sys.stdin.read()
    stripped = text.strip()
    if stripped.startswith("{"):  # the --json output of a previous step
        import json

        try:
            return Path(json.loads(stripped)["path"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError('stdin holds JSON without a "path"', hint=hint) from exc
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ConfigError("'-' reads the input path from stdin, but stdin was empty", hint=hint)
    if len(lines) > 1:
        raise ConfigError(
            f"stdin holds {len(lines)} lines; '-' takes exactly one path",
            hint="pass the paths as arguments instead",
        )
    return Path(lines[0])


def setup_compute(device: str, threads: int | None) -> tuple[str, int]:
    """Resolve --device and set torch threads; returns both as used."""
    from uqcompress.runtime.device import configure_threads, resolve_device

    return resolve_device(device), configure_threads(threads)


# --- training options (finetune, svd-ensemble, distill-director) -----------------------------
SelectBest = Annotated[
    str | None,
    typer.Option(
        "--select-best",
        help="Keep the weights of the epoch best on --val by this metric: nll, acc, ece, loss "
        "(the training loss on --val) or none (the last epoch). Default: nll with --val, none "
        "without.",
        show_default=False,
    ),
]
Patience = Annotated[
    int | None,
    typer.Option(
        "--patience",
        help="Stop after this many epochs without a better --select-best metric on --val. "
        "Default: train every epoch.",
        show_default=False,
    ),
]
GradAccum = Annotated[
    int,
    typer.Option(
        "--grad-accum",
        help="Micro-batches of --batch-size per optimizer step (effective batch: their product).",
    ),
]
MaxSteps = Annotated[
    int | None,
    typer.Option(
        "--max-steps",
        help="Train for exactly this many optimizer steps, overriding --epochs (the last pass "
        "over the data may be partial). Default: --epochs passes.",
        show_default=False,
    ),
]
Schedule = Annotated[
    str,
    typer.Option(
        "--schedule",
        help="Learning rate after the warm-up: linear (decay to 0), cosine (to 0) or constant.",
    ),
]
Workers = Annotated[
    int,
    typer.Option(
        "--workers",
        help="Data-loader worker processes that read and preprocess batches while the model "
        "runs (0: in this process). Results do not depend on it.",
    ),
]
Augment = Annotated[
    str,
    typer.Option(
        "--augment",
        help="Training-image augmentation: none, or light (random resized crop keeping 80-100% "
        "of the area, shifts of up to 5%; no flips).",
    ),
]
Warmup = Annotated[
    float,
    typer.Option(
        "--warmup",
        help="Linear warm-up, as a fraction of the optimizer steps in [0, 1) (0: none).",
    ),
]
CheckpointEvery = Annotated[
    int | None,
    typer.Option(
        "--checkpoint-every",
        help="Write a resumable checkpoint every N optimizer steps into .OUT.resume beside the "
        "output (removed when the run completes). Default: none.",
        show_default=False,
    ),
]
Optimizer = Annotated[
    str,
    typer.Option(
        "--optimizer",
        help="adamw (decoupled weight decay), adam (weight decay as L2 in the gradient, as "
        "torch.optim.Adam) or sgd (momentum 0.9, L2).",
    ),
]
Ema = Annotated[
    float | None,
    typer.Option(
        "--ema",
        help="Keep an exponential moving average of the trained weights with this decay in "
        "(0, 1), e.g. 0.995; validation, --select-best and the saved model use the average. "
        "Default: none.",
        show_default=False,
    ),
]
EmaEvery = Annotated[
    int,
    typer.Option("--ema-every", help="Optimizer steps between updates of the --ema average."),
]
EmaStart = Annotated[
    int,
    typer.Option(
        "--ema-start",
        help="Optimizer steps during which the --ema average just copies the weights, "
        "before it starts averaging.",
    ),
]
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue an interrupted run of the same command from its last checkpoint.",
    ),
]


# The options every step spells the same way, by recipe key: a generated command takes the
# option from here unless its config field has a help of its own (`steps/config.py`).
SHARED: dict[str, object] = {
    "device": Device,
    "threads": Threads,
    "workers": Workers,
    "seed": Seed,
    "batch_size": BatchSize,
    "max_length": MaxLength,
    "text_column": TextColumn,
    "text_pair_column": TextPairColumn,
    "label_column": LabelColumn,
    "weight_decay": WeightDecay,
    "select_best": SelectBest,
    "patience": Patience,
    "grad_accum": GradAccum,
    "max_steps": MaxSteps,
    "schedule": Schedule,
    "warmup": Warmup,
    "optimizer": Optimizer,
    "ema": Ema,
    "ema_every": EmaEvery,
    "ema_start": EmaStart,
    "checkpoint_every": CheckpointEvery,
    "resume": Resume,
    "augment": Augment,
}
