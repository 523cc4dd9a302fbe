"""Registry of model families, looked up by name (`uqc init --family`) or by model_type.

Every module of this package that declares `REGISTERED` (a tuple of `Family` instances) is
registered; nothing else lists families. A family owns every fact a method needs about it:
its anatomy (base.py's docstring), `layout`, `sizes`, the config keys Hydra members must share
(`shape_keys`), MC Dropout's sites (`dropout_sites`, None: refused) and Hydra's per-member
norm (`member_norm`).

To add a family:

1. A BERT-like encoder (BERT's modules under another backbone name, e.g. ERNIE): one file
   `families/NAME.py` with a `BertFamily` subclass setting `name`, `backbone`, `model_types`
   (the checkpoints' model_type, distinct from every other family's), `dropout_sites` (None
   unless MC Dropout's sites were checked for it), `build_config`, `classifier_class` and
   `build_embeddings`, then `REGISTERED = (NameFamily(),)`. Everything else is inherited.
2. A Llama-like decoder: one file with a `LlamaFamily` subclass (`_config_class`,
   `classifier_class`, `_rotary_class`, `presets`; `embed` where it scales the embeddings).
   With its own norm class, the same file also defines the per-member norm (a module with
   `weight` `[M, d]` and `bias` `[M, d]` or None, computing what the family's norm does) and
   returns it from `member_norm`; base.py's `member_norm` shows the two built in.
3. Another layout: a `Family` subclass implementing every abstract method of base.py.
4. Tests: one entry in `FAMILIES` of tests/models/test_family_conformance.py (`_text(NAME,
   imported=False)` builds it with `uqc init` and the shipped vocabulary; an imported
   family, the default, also needs its tokenizer in tests/checkpoints.py). The anatomy,
   facts and Hydra tests run every registered family already.

docs/guide/families.md's tables and `uqc init --family`'s help text are documentation to update
by hand. The order families are listed in (help texts, refusals) is `_LISTING`; a family not
in it comes after the others of its kind (text encoders, decoders, images), by module name.
"""

from __future__ import annotations

import importlib
import pkgutil
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

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Text encoders, text decoders, then image families: the order help texts list.
_LISTING = (
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "electra",
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "vit",
    "deit",
    "dinov2",
)


def _kind(family: Family) -> int:
    """0: text encoders, 1: text decoders, 2: image families (the listing's groups)."""
    if family.input_kind == "image":
        return 2
    return 1 if family.layout.causal else 0


def _registered() -> list[Family]:
    """The `REGISTERED` families of every module in this package, in module-name order."""
    found: list[Family] = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        found += getattr(importlib.import_module(f"{__name__}.{module.name}"), "REGISTERED", ())
    return found


def _listed(families: list[Family]) -> list[Family]:
    """`families` by kind, those in `_LISTING` first in its order (sorted is stable)."""
    return sorted(
        families,
        key=lambda f: (
            _kind(f),
            _LISTING.index(f.name) if f.name in _LISTING else len(_LISTING),
        ),
    )


FAMILIES: dict[str, Family] = {family.name: family for family in _listed(_registered())}


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
        hint="import a checkpoint of a supported family (docs/guide/families.md)",
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
