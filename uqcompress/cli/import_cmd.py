"""`uqc import`: turn a transformers directory into a model artifact."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Force, Json, Out, resolve_input


def import_model(
    source: Annotated[
        str,
        typer.Argument(
            help="A transformers save_pretrained directory, or a Hugging Face Hub id "
            "(org/name, downloaded when online) ('-' reads stdin)."
        ),
    ],
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code",
            help="Accept a checkpoint whose config asks to run its own code (auto_map). uqc "
            "never runs that code; it loads the weights with transformers' classes for the family.",
        ),
    ] = False,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Import a transformers model directory (weights, config, tokenizer or image processor)."""
    from uqcompress.cli.invoke import run_step

    options = {"source": resolve_input(source), "trust_remote_code": trust_remote_code}
    run_step("import", options, force, json_out, out)
