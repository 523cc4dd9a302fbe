"""`uqc fuse`: M pruned members -> one Hydra model (GFC fused attention, merged MLP)."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Device, Force, Json, Out, Threads, resolve_input, setup_compute


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
    from uqcompress.cli.output import emit
    from uqcompress.steps import fuse as step

    paths = [resolve_input(m) for m in members]
    resolved_device, resolved_threads = setup_compute(device, threads)
    cfg = step.FuseConfig(device=resolved_device, threads=resolved_threads)
    emit(step.run(paths, cfg, out, force), json_out)
