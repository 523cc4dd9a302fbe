"""Registry of model families, looked up by name (`uqc init --family`) or by model_type."""

from __future__ import annotations

from typing import TYPE_CHECKING

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import (
    AttentionParts,
    BlockParts,
    BlockSizes,
    Family,
    HeadParts,
    Layout,
    MlpParts,
)
from uqcompress.models.families.bert import BertFamily
from uqcompress.models.families.deit import DeiTFamily
from uqcompress.models.families.dinov2 import Dinov2Family
from uqcompress.models.families.distilbert import DistilBertFamily
from uqcompress.models.families.electra import ElectraFamily
from uqcompress.models.families.llama import LlamaFamily
from uqcompress.models.families.mistral import MistralFamily
from uqcompress.models.families.qwen import Qwen2Family, Qwen3Family
from uqcompress.models.families.roberta import RobertaFamily, XLMRobertaFamily
from uqcompress.models.families.vit import ViTFamily

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Text encoders, text decoders, then image families: the order help texts list.
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        BertFamily(),
        RobertaFamily(),
        XLMRobertaFamily(),
        DistilBertFamily(),
        ElectraFamily(),
        LlamaFamily(),
        Qwen2Family(),
        Qwen3Family(),
        MistralFamily(),
        ViTFamily(),
        DeiTFamily(),
        Dinov2Family(),
    )
}


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
            family.check_loadable(config, where)
            return family
    raise ConfigError(
        f"{where} holds a {model_type!r} model, which uqc does not support; supported "
        f"families: {', '.join(FAMILIES)}",
        hint="import a checkpoint of a supported family (README: Supported families)",
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
    "BlockSizes",
    "Family",
    "HeadParts",
    "Layout",
    "MlpParts",
    "family_by_name",
    "family_for_config",
    "family_named",
]
