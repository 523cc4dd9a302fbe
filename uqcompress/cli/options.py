"""Options shared by every step: same names, same help, same defaults everywhere."""

from __future__ import annotations

import sys
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
    bool, typer.Option("--force", help="Replace whatever --out holds. Default: refuse.")
]
Json = Annotated[
    bool,
    typer.Option("--json", help="Print the result as JSON on stdout instead of the path."),
]
Device = Annotated[
    str,
    typer.Option("--device", help="auto, cpu, cuda or cuda:N. Default: auto (cuda if visible)."),
]
Threads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="CPU threads for torch. Default: 1, or $UQC_THREADS "
        "(measured faster than 2 for training on 2-core machines).",
        show_default=False,
    ),
]
Seed = Annotated[int, typer.Option("--seed", help="Random seed. Default: 0.")]
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
    str, typer.Option("--text-column", help="Text column of CSV data. Default: text.")
]
LabelColumn = Annotated[
    str, typer.Option("--label-column", help="Label column of CSV data. Default: label.")
]


def resolve_input(value: str) -> Path:
    """An input path, where '-' reads the path from the first line of stdin."""
    if value != "-":
        return Path(value)
    line = sys.stdin.readline().strip()
    if not line:
        raise ConfigError(
            "'-' means: read the input path from stdin, but stdin was empty",
            hint="pipe a step's output in, e.g. uqc init ... | uqc finetune - --data D",
        )
    return Path(line)


def setup_compute(device: str, threads: int | None) -> tuple[str, int]:
    """Resolve --device and set torch threads; returns both as used."""
    from uqcompress.device import configure_threads, resolve_device

    return resolve_device(device), configure_threads(threads)
