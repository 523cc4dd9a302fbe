"""ViT image classifiers (transformers 5.x layout: `vit.layers[i].attention.{q,k,v,o}_proj`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import AttentionParts, Family

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


class ViTFamily(Family):
    name = "vit"
    model_types = ("vit",)
    input_kind = "image"
    # tiny/small default to 8x8 grey images in 2x2 patches (scikit-learn's digits: 16 tokens);
    # base is ViT-B/16 on 224x224 RGB.
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
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=128,
            image_size=8,
            patch_size=2,
            num_channels=1,
            hidden_dropout_prob=0.1,
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

    def build_config(
        self,
        preset: str,
        overrides: dict[str, Any],
        labels: list[str],
        image_size: int | None = None,
        patch_size: int | None = None,
    ) -> PretrainedConfig:
        from transformers import ViTConfig

        values: dict[str, Any] = dict(self.presets[preset])
        if image_size is not None:
            values["image_size"] = image_size
        if patch_size is not None:
            values["patch_size"] = patch_size
        values.update(overrides)
        if values["image_size"] % values["patch_size"] != 0:
            raise ConfigError(
                f"--image-size {values['image_size']} is not a multiple of "
                f"--patch-size {values['patch_size']}",
                hint="choose a patch size that divides the image size, e.g. --patch-size 2",
            )
        return ViTConfig(
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            **values,
        )

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import ViTForImageClassification

        return ViTForImageClassification

    def attention_layers(self, model: nn.Module) -> list[AttentionParts]:
        root: Any = model  # transformers modules are untyped attribute trees
        layers = root.vit.layers
        return [
            AttentionParts(
                query=layer.attention.q_proj,
                key=layer.attention.k_proj,
                value=layer.attention.v_proj,
                output=layer.attention.o_proj,
            )
            for layer in layers
        ]

    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        root: Any = model
        block = root.vit.layers[layer]
        if heads == 0:
            from uqcompress.models.no_heads import NoHeadsAttention

            block.attention = NoHeadsAttention(parts.query, parts.key, parts.value, parts.output)
            return
        attention = block.attention
        attention.q_proj, attention.k_proj = parts.query, parts.key
        attention.v_proj, attention.o_proj = parts.value, parts.output
        if hasattr(attention, "num_heads"):
            attention.num_heads = heads
