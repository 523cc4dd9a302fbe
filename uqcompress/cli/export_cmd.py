"""`uqc export`: ONNX with the uncertainty outputs in the graph, or safetensors."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import (
    Device,
    Force,
    Json,
    LabelColumn,
    Out,
    TextColumn,
    TextPairColumn,
    Threads,
    resolve_input,
)


def export(
    model: Annotated[str, typer.Argument(help="Model artifact or transformers dir ('-': stdin).")],
    format_: Annotated[str, typer.Option("--format", help="onnx or safetensors.")] = "onnx",
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="Real examples for the ONNX parity check (labels not "
            "needed). Default: synthetic inputs.",
            show_default=False,
        ),
    ] = None,
    atol: Annotated[
        float,
        typer.Option(
            "--atol",
            help="Largest allowed |probs difference| ONNX vs "
            "PyTorch (absolute, probability units).",
        ),
    ] = 1e-4,
    opset: Annotated[int, typer.Option("--opset", help="ONNX opset, 18..23.")] = 18,
    materialize: Annotated[
        bool,
        typer.Option(
            "--materialize",
            help="SVE models: dense per-member weights in the graph (M weight copies, fewer "
            "FLOPs per member) instead of the factorised form (U, V once; small file).",
        ),
    ] = False,
    max_length: Annotated[
        int | None,
        typer.Option(
            "--max-length",
            help="Text: the token length the exported model truncates to. Default: the "
            "length it was fine-tuned at (else its position table); at most the position table.",
            show_default=False,
        ),
    ] = None,
    text_column: TextColumn = "text",
    label_column: LabelColumn = "label",
    text_pair_column: TextPairColumn = None,
    device: Device = "cpu",
    threads: Threads = None,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Export a model; ONNX must match PyTorch on real batches or nothing is written (exit 3)."""
    from uqcompress.cli.invoke import run_step

    options = {
        "model": resolve_input(model),
        "format": format_,
        "data": data,
        "atol": atol,
        "opset": opset,
        "materialize": materialize,
        "max_length": max_length,
        "text_column": text_column,
        "label_column": label_column,
        "text_pair_column": text_pair_column,
        "device": device,
        "threads": threads,
    }
    run_step("export", options, force, json_out, out)
