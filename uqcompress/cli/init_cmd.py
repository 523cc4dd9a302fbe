"""`uqc init`: a new untrained model artifact."""

from __future__ import annotations

from typing import Annotated

import typer

from uqcompress.cli.options import Force, Json, Out, Seed


def init(
    family: Annotated[
        str,
        typer.Option(
            "--family",
            help="Model family. Text: bert, roberta, xlm-roberta, distilbert, electra. "
            "Images: vit, deit, dinov2.",
        ),
    ],
    preset: Annotated[
        str, typer.Option("--preset", help="Size preset: tiny, small or base.")
    ] = "tiny",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a transformers config value, key=value "
            "(repeatable), e.g. --set num_hidden_layers=6.",
        ),
    ] = None,
    labels: Annotated[
        str | None,
        typer.Option(
            "--labels", help="Comma-separated class names, e.g. neg,pos.", show_default=False
        ),
    ] = None,
    num_labels: Annotated[
        int | None,
        typer.Option(
            "--num-labels",
            help="Number of classes (names then come from the data).",
            show_default=False,
        ),
    ] = None,
    image_size: Annotated[
        int | None,
        typer.Option(
            "--image-size",
            help="Image families: input side in pixels. Default: the preset's (8 for tiny, "
            "224 for base).",
            show_default=False,
        ),
    ] = None,
    patch_size: Annotated[
        int | None,
        typer.Option(
            "--patch-size",
            help="Image families: patch side in pixels. Default: the preset's (2 for tiny, "
            "16 for ViT/DeiT base, 14 for DINOv2).",
            show_default=False,
        ),
    ] = None,
    seed: Seed = 0,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Create an untrained model artifact from a transformers config (no download)."""
    from uqcompress.cli.invoke import run_step

    options = {
        "family": family,
        "preset": preset,
        "set": set_,
        "labels": labels,
        "num_labels": num_labels,
        "image_size": image_size,
        "patch_size": patch_size,
        "seed": seed,
    }
    run_step("init", options, force, json_out, out)
