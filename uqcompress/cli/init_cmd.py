"""`uqc init`: a new untrained model artifact."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from uqcompress.cli.options import Force, Json, Out, Seed
from uqcompress.errors import ConfigError


def parse_sets(values: list[str]) -> dict[str, Any]:
    """`--set key=value` pairs; values are parsed as JSON when they can be (ints, floats)."""
    import json

    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is not key=value", hint="e.g. --set hidden_size=64")
        try:
            parsed[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key.strip()] = raw
    return parsed


def init(
    family: Annotated[str, typer.Option("--family", help="Model family: bert or vit.")],
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
            help="ViT input side in pixels. Default: preset's (8 for tiny/small, 224 for base).",
            show_default=False,
        ),
    ] = None,
    patch_size: Annotated[
        int | None,
        typer.Option(
            "--patch-size",
            help="ViT patch side in pixels. Default: preset's (2 for tiny/small, 16 for base).",
            show_default=False,
        ),
    ] = None,
    seed: Seed = 0,
    out: Out = None,
    force: Force = False,
    json_out: Json = False,
) -> None:
    """Create an untrained model artifact from a transformers config (no download)."""
    from uqcompress.cli.output import emit
    from uqcompress.steps import init as step

    label_list = [x.strip() for x in labels.split(",")] if labels is not None else None
    cfg = step.InitConfig(
        family=family,
        preset=preset,
        overrides=parse_sets(set_ or []),
        labels=label_list,
        num_labels=num_labels,
        image_size=image_size,
        patch_size=patch_size,
        seed=seed,
    )
    emit(step.run(cfg, out, force), json_out)
