"""Registry of model families, looked up by name (`uqc init --family`) or by model_type."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import (
    AttentionParts,
    BlockParts,
    Family,
    HeadParts,
    Layout,
    MlpParts,
)
from uqcompress.models.families.bert import BertFamily
from uqcompress.models.families.vit import ViTFamily

if TYPE_CHECKING:
    from transformers import PretrainedConfig

FAMILIES: dict[str, Family] = {family.name: family for family in (BertFamily(), ViTFamily())}


def family_by_name(name: str) -> Family:
    if name not in FAMILIES:
        raise ConfigError(
            f"unknown model family {name!r}",
            hint=f"use --family with one of: {', '.join(sorted(FAMILIES))}",
        )
    return FAMILIES[name]


def family_for_config(config: PretrainedConfig, where: str) -> Family:
    model_type = getattr(config, "model_type", None)
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    supported = sorted(t for f in FAMILIES.values() for t in f.model_types)
    raise ConfigError(
        f"{where} holds a {model_type!r} model; uqc supports model_type {', '.join(supported)}",
        hint="use a BERT-family text classifier or a ViT image classifier",
    )


def family_named(family: Family | str) -> Family | None:
    """`family` itself, or the registered family of that name (None if there is none)."""
    if isinstance(family, Family):
        return family
    return FAMILIES.get(family)


__all__ = [
    "FAMILIES",
    "AttentionParts",
    "BlockParts",
    "Family",
    "HeadParts",
    "Layout",
    "MlpParts",
    "family_by_name",
    "family_for_config",
    "family_named",
]
