"""`uqc fuse`: M pruned members -> one Hydra model (GFC fused attention, merged MLP)."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Out, Threads, resolve_input


def fuse(
    members: Annotated[
        list[str],
        typer.Argument(
            metavar="MEMBERS...",
            help="A members artifact (uqc prune --members M), or several pruned model "
            "artifacts of one base ('-': read one path from stdin).",
        ),
    ],
    device: Device = "cpu",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Fuse pruned members into one Hydra model: one forward pass, M member predictions.

    The result is a model artifact that finetune (mean of member cross-entropies), eval (as
    an ensemble) and export (member_logits [B, M, C]) take like any model.
    """
    from uqcompress.cli.invoke import run_step

    options = {
        "members": [resolve_input(m) for m in members],
        "device": device,
        "threads": threads,
    }
    run_step("fuse", options, force, json_out, out)
