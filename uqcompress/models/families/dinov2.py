"""DINOv2 image classifiers (`Dinov2ForImageClassification`).

What differs from ViT: the blocks are `norm1` -> attention -> `layer_scale1` -> add, `norm2`
-> MLP -> `layer_scale2` -> add (a learned `[d]` scale on each sublayer's output), the MLP is
`fc1/fc2` or, in the giant variants, SwiGLU (`gate_proj/up_proj/down_proj`), position
embeddings are interpolated to the image size, and the classifier reads `[CLS ; mean of the
patch tokens]` (twice the hidden width).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import (
    BLOCK_SHAPE_KEYS,
    BlockParts,
    BlockSizes,
    Family,
    HeadParts,
    Layout,
    MlpParts,
    config_head_dim,
)
from uqcompress.models.families.vit import ViTFamily

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


class Dinov2Family(ViTFamily):
    """Pre-LN encoder with layer scale: `dinov2.embeddings` -> `dinov2.encoder.layer[i]` ->
    `dinov2.layernorm` -> `classifier` on `[CLS ; mean(patches)]`."""

    name = "dinov2"
    model_types = ("dinov2",)
    backbone = "dinov2"
    special_tokens = 1
    shape_keys = (
        *BLOCK_SHAPE_KEYS,
        "layer_norm_eps",
        "mlp_ratio",
        "use_swiglu_ffn",
        "image_size",
        "patch_size",
        "num_channels",
    )
    dropout_sites = None  # MC Dropout's sites: not mapped (nor tested) for DINOv2
    mlp_width_key = None  # the width is hidden_size x mlp_ratio (SwiGLU: rounded), not a key
    layout = Layout(
        norm_order="pre",
        norm="layernorm",
        gated_mlp=False,
        final_norm=True,
        pooler_activation=None,
        pooled_token="first_and_mean",
        layer_scale=True,
    )
    # tiny: 8x8 grey images (scikit-learn's digits). small and base: the weights' shapes of
    # facebook/dinov2-small and -base at the 224-pixel crops their image processor makes
    # (the checkpoints' position grid is 37x37 for 518 pixels, interpolated to the input).
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            mlp_ratio=2,
            image_size=8,
            patch_size=2,
            num_channels=1,
        ),
        "small": dict(
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            mlp_ratio=4,
            image_size=224,
            patch_size=14,
            num_channels=3,
        ),
        "base": dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            mlp_ratio=4,
            image_size=224,
            patch_size=14,
            num_channels=3,
        ),
    }

    def _config_class(self) -> Any:
        from transformers import Dinov2Config

        return Dinov2Config

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import Dinov2ForImageClassification

        return Dinov2ForImageClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.dinov2.modeling_dinov2 import Dinov2Embeddings

        return Dinov2Embeddings(config)  # type: ignore[arg-type]

    def sizes(self, config: PretrainedConfig) -> BlockSizes:
        cfg: Any = config
        inner = int(int(cfg.hidden_size) * cfg.mlp_ratio)
        swiglu = bool(getattr(cfg, "use_swiglu_ffn", False))
        if swiglu:  # Dinov2SwiGLUFFN: two thirds of the width, rounded up to a multiple of 8
            inner = (int(inner * 2 / 3) + 7) // 8 * 8
        return BlockSizes(
            hidden=int(cfg.hidden_size),
            intermediate=inner,
            norm_eps=float(cfg.layer_norm_eps),
            activation="silu" if swiglu else str(cfg.hidden_act),
            attention_dropout=float(cfg.attention_probs_dropout_prob),
            hidden_dropout=float(cfg.hidden_dropout_prob),
            gated_mlp=swiglu,
        )

    def embed(
        self, embeddings: nn.Module, inputs: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        module: Any = embeddings
        pixels = inputs["pixel_values"].to(module.patch_embeddings.projection.weight.dtype)
        return module(pixels), None

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(self._backbone(model).encoder.layer)

    def block_parts(self, block: nn.Module, config: PretrainedConfig) -> BlockParts:
        layer: Any = block
        mlp = layer.mlp
        if hasattr(mlp, "gate_proj"):  # SwiGLU
            parts = MlpParts(
                up=mlp.up_proj, down=mlp.down_proj, activation="silu", gate=mlp.gate_proj
            )
        else:
            parts = MlpParts(up=mlp.fc1, down=mlp.fc2, activation=str(config.hidden_act))
        return BlockParts(
            attention=self.attention_parts(block, config_head_dim(config)),
            mlp=parts,
            norm_attention=layer.norm1,
            norm_mlp=layer.norm2,
            attention_scale=layer.layer_scale1.lambda1,
            mlp_scale=layer.layer_scale2.lambda1,
        )

    def mlp_sublayer(self, block: nn.Module) -> dict[str, nn.Module]:
        layer: Any = block
        return {"norm": layer.norm2, "mlp": layer.mlp, "scale": layer.layer_scale2}

    def run_mlp_sublayer(
        self, modules: Mapping[str, nn.Module], hidden: torch.Tensor
    ) -> torch.Tensor:
        # Drop path lives on the block and is the identity in eval mode.
        out: torch.Tensor = hidden + modules["scale"](modules["mlp"](modules["norm"](hidden)))
        return out

    def head_parts(self, model: nn.Module) -> HeadParts:
        root: Any = model
        norm = self._backbone(model).layernorm
        return HeadParts(final_norm=norm, pooler=None, classifier=root.classifier)

    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        import torch

        normed = modules["final_norm"](hidden)  # per token, the whole sequence (the mean reads it)
        features = torch.cat([normed[:, 0], normed[:, 1:].mean(dim=1)], dim=1)  # [B, 2d]
        logits: torch.Tensor = modules["classifier"](features)
        return logits


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (Dinov2Family(),)
