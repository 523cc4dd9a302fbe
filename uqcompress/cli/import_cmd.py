"""`uqc import`: turn a transformers directory into a model artifact."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Force, Json, Out, resolve_input


def import_model(
    source: Annotated[
        str, typer.Argument(help="A transformers save_pretrained directory ('-' reads stdin).")
    ],
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Import a transformers model directory (weights, config, tokenizer or image processor)."""
    from uqcompress.cli.output import emit
    from uqcompress.steps import import_ as step

    emit(step.run(resolve_input(source), out, force), json_out)
