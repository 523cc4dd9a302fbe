"""ViT image classifiers (transformers 5.x layout: `vit.layers[i].attention.{q,k,v,o}_proj`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import (
    BLOCK_SHAPE_KEYS,
    AttentionParts,
    BlockParts,
    DropoutSites,
    Family,
    HeadParts,
    Layout,
    MlpParts,
    config_head_dim,
    label_fields,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


class ViTFamily(Family):
    """Pre-LN encoder: `vit.embeddings` (patches + CLS) -> `vit.layers[i]` (`layernorm_before`,
    attention `{q,k,v,o}_proj`, add; `layernorm_after`, `mlp.fc1/fc2`, add) ->
    `vit.layernorm` -> `classifier` on [CLS]. No pooler."""

    name = "vit"
    model_types: tuple[str, ...] = ("vit",)
    backbone: ClassVar[str] = "vit"  # the classifier's attribute holding the encoder
    special_tokens: ClassVar[int] = 1  # tokens before the patches: CLS
    input_kind = "image"
    shape_keys: ClassVar[tuple[str, ...]] = (
        *BLOCK_SHAPE_KEYS,
        "layer_norm_eps",
        "image_size",
        "patch_size",
        "num_channels",
    )
    dropout_sites: ClassVar[DropoutSites | None] = DropoutSites(classifier=False)
    layout = Layout(
        norm_order="pre",
        norm="layernorm",
        gated_mlp=False,
        final_norm=True,
        pooler_activation=None,
    )
    # ViT's attention takes `head_dim` through getattr. (BERT ignores it: there it would be a
    # silent no-op, so it stays unknown to `--set`.)
    extra_config_keys = ("head_dim",)
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
        config: PretrainedConfig = self._config_class()(**label_fields(labels), **values)
        return config

    def _config_class(self) -> Any:
        from transformers import ViTConfig

        return ViTConfig

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import ViTForImageClassification

        return ViTForImageClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.vit.modeling_vit import ViTEmbeddings

        return ViTEmbeddings(config)  # type: ignore[arg-type]

    def fixed_tokens(self, config: PretrainedConfig) -> int | None:
        per_side = int(config.image_size) // int(config.patch_size)
        return per_side * per_side + self.special_tokens

    def _backbone(self, model: nn.Module) -> Any:
        return getattr(model, self.backbone)  # transformers modules are untyped trees

    def embeddings(self, model: nn.Module) -> nn.Module:
        return self._backbone(model).embeddings

    def embed(
        self, embeddings: nn.Module, inputs: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        module: Any = embeddings
        # As ViTModel does: pixels in the weights' dtype (a half-precision model takes floats).
        pixels = inputs["pixel_values"].to(module.patch_embeddings.projection.weight.dtype)
        return module(pixels), None  # every patch attends to every patch: no mask

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(self._backbone(model).layers)

    def attention_parts(self, block: nn.Module, head_dim: int) -> AttentionParts:
        layer: Any = block
        return AttentionParts(
            query=layer.attention.q_proj,
            key=layer.attention.k_proj,
            value=layer.attention.v_proj,
            output=layer.attention.o_proj,
            head_dim=head_dim,
        )

    def block_parts(self, block: nn.Module, config: PretrainedConfig) -> BlockParts:
        layer: Any = block
        return BlockParts(
            attention=self.attention_parts(block, config_head_dim(config)),
            mlp=MlpParts(up=layer.mlp.fc1, down=layer.mlp.fc2, activation=str(config.hidden_act)),
            norm_attention=layer.layernorm_before,
            norm_mlp=layer.layernorm_after,
        )

    def mlp_sublayer(self, block: nn.Module) -> dict[str, nn.Module]:
        layer: Any = block
        return {"norm": layer.layernorm_after, "mlp": layer.mlp}

    def run_mlp_sublayer(
        self, modules: Mapping[str, nn.Module], hidden: torch.Tensor
    ) -> torch.Tensor:
        # The block's residual dropout lives on the block, not in these modules: in eval mode
        # this is exactly the block's second half.
        out: torch.Tensor = hidden + modules["mlp"](modules["norm"](hidden))
        return out

    def head_parts(self, model: nn.Module) -> HeadParts:
        root: Any = model
        norm = self._backbone(model).layernorm
        return HeadParts(final_norm=norm, pooler=None, classifier=root.classifier)

    def head_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        root: Any = model
        return {"final_norm": self._backbone(model).layernorm, "classifier": root.classifier}

    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # The norm is per token, so norming [CLS] alone equals norming the whole sequence
        # (ViTModel) and taking [CLS] after.
        logits: torch.Tensor = modules["classifier"](modules["final_norm"](hidden[:, 0]))
        return logits

    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        block: Any = self.blocks(model)[layer]
        if heads == 0:
            from uqcompress.models.no_heads import NoHeadsAttention

            block.attention = NoHeadsAttention(
                "o_proj",
                q_proj=parts.query,
                k_proj=parts.key,
                v_proj=parts.value,
                o_proj=parts.output,
            )
            return
        attention = block.attention
        attention.q_proj, attention.k_proj = parts.query, parts.key
        attention.v_proj, attention.o_proj = parts.value, parts.output
        if hasattr(attention, "num_heads"):
            attention.num_heads = heads


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (ViTFamily(),)
