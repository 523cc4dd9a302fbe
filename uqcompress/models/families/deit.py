"""DeiT image classifiers: ViT's blocks under `deit`, with a distillation token beside CLS.

DeiT's embeddings put two tokens before the patches (CLS, then the distillation token);
`DeiTForImageClassification` classifies from CLS alone, so everything else is ViT's.
`DeiTForImageClassificationWithTeacher` checkpoints average a second classifier on the
distillation token: uqc refuses them by name rather than silently dropping that head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import Family
from uqcompress.models.families.vit import ViTFamily

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

WITH_TEACHER = "DeiTForImageClassificationWithTeacher"


class DeiTFamily(ViTFamily):
    """Pre-LN encoder: `deit.embeddings` (patches + CLS + distillation token) ->
    `deit.layers[i]` (ViT's blocks) -> `deit.layernorm` -> `classifier` on CLS."""

    name = "deit"
    model_types = ("deit",)
    backbone = "deit"
    special_tokens = 2  # CLS and the distillation token
    dropout_sites = None  # MC Dropout's sites: not mapped (nor tested) for DeiT
    # tiny: 8x8 grey images (scikit-learn's digits); small and base: the shapes of
    # facebook/deit-small-patch16-224 and deit-base-patch16-224.
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=8,
            patch_size=2,
            num_channels=1,
        ),
        "small": dict(
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            intermediate_size=1536,
            image_size=224,
            patch_size=16,
            num_channels=3,
        ),
        "base": dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            image_size=224,
            patch_size=16,
            num_channels=3,
        ),
    }

    def _config_class(self) -> Any:
        from transformers import DeiTConfig

        return DeiTConfig

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import DeiTForImageClassification

        return DeiTForImageClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.deit.modeling_deit import DeiTEmbeddings

        return DeiTEmbeddings(config)  # type: ignore[arg-type]

    def check_loadable(self, config: PretrainedConfig, where: str) -> None:
        if WITH_TEACHER in (getattr(config, "architectures", None) or []):
            raise ConfigError(
                f"{where} is a {WITH_TEACHER} checkpoint (a second classifier on the "
                "distillation token); uqc takes DeiTForImageClassification, which reads CLS only",
                hint="use a DeiTForImageClassification checkpoint (e.g. a non-distilled "
                "facebook/deit-*-patch16-224), or fine-tune one and save_pretrained() it",
            )


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (DeiTFamily(),)
