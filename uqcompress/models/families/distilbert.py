"""DistilBERT text classifiers.

What differs from BERT: the projections are `attention.{q,k,v,out}_lin` and `ffn.lin1/lin2`,
the norms `sa_layer_norm` / `output_layer_norm` sit on the blocks (post-LN), there are no
token types, the config says `dim`/`hidden_dim`/`n_heads` and `activation`, and the head is
`pre_classifier` -> ReLU -> `classifier` on the first token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import (
    BLOCK_SHAPE_KEYS,
    AttentionParts,
    BlockParts,
    BlockSizes,
    Family,
    HeadParts,
    Layout,
    MlpParts,
    additive_mask,
    config_head_dim,
    label_fields,
    text_config_values,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

LAYER_NORM_EPS = 1e-12  # fixed in DistilBERT's code, not in its config


class DistilBertFamily(Family):
    """Post-LN encoder: `distilbert.embeddings` -> `distilbert.transformer.layer[i]`
    (attention, add, `sa_layer_norm`; `ffn`, add, `output_layer_norm`) -> `pre_classifier`
    + ReLU on [CLS] -> `dropout` -> `classifier`."""

    name = "distilbert"
    model_types = ("distilbert",)
    input_kind = "text"
    # (`hidden_dim` and `activation` are DistilBERT's names of the MLP width and activation)
    shape_keys = (*BLOCK_SHAPE_KEYS, "vocab_size", "max_position_embeddings")
    mlp_width_key = "hidden_dim"
    layout = Layout(
        norm_order="post",
        norm="layernorm",
        gated_mlp=False,
        final_norm=False,
        pooler_activation="relu",
    )
    # base: distilbert-base-uncased. small: a narrower DistilBERT (no public checkpoint).
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128),
        "small": dict(dim=256, n_layers=4, n_heads=4, hidden_dim=1024, max_position_embeddings=512),
        "base": dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512),
    }

    def build_config(
        self,
        preset: str,
        overrides: dict[str, Any],
        labels: list[str],
        image_size: int | None = None,
        patch_size: int | None = None,
    ) -> PretrainedConfig:
        from transformers import DistilBertConfig

        values = text_config_values(self.presets[preset], overrides)
        return DistilBertConfig(**label_fields(labels), **values)

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import DistilBertForSequenceClassification

        return DistilBertForSequenceClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.distilbert.modeling_distilbert import Embeddings

        return Embeddings(config)  # type: ignore[arg-type]

    def max_length(self, config: PretrainedConfig) -> int | None:
        return int(config.max_position_embeddings)

    def classifier_dropout(self, config: PretrainedConfig) -> float:
        return float(config.seq_classif_dropout)

    def sizes(self, config: PretrainedConfig) -> BlockSizes:
        cfg: Any = config
        return BlockSizes(
            hidden=int(cfg.dim),
            intermediate=int(cfg.hidden_dim),
            norm_eps=LAYER_NORM_EPS,
            activation=str(cfg.activation),
            attention_dropout=float(cfg.attention_dropout),
            hidden_dropout=float(cfg.dropout),
        )

    def embeddings(self, model: nn.Module) -> nn.Module:
        root: Any = model
        embeddings: nn.Module = root.distilbert.embeddings
        return embeddings

    def embed(
        self, embeddings: nn.Module, inputs: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = embeddings(inputs["input_ids"])  # no token types in DistilBERT
        return hidden, additive_mask(inputs.get("attention_mask"), hidden.dtype)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        root: Any = model
        return list(root.distilbert.transformer.layer)

    def attention_parts(self, block: nn.Module, head_dim: int) -> AttentionParts:
        attention: Any = getattr(block, "attention")  # noqa: B009 (untyped module tree)
        return AttentionParts(
            query=attention.q_lin,
            key=attention.k_lin,
            value=attention.v_lin,
            output=attention.out_lin,
            head_dim=head_dim,
        )

    def block_parts(self, block: nn.Module, config: PretrainedConfig) -> BlockParts:
        layer: Any = block
        return BlockParts(
            attention=self.attention_parts(block, config_head_dim(config)),
            mlp=MlpParts(
                up=layer.ffn.lin1, down=layer.ffn.lin2, activation=self.sizes(config).activation
            ),
            norm_attention=layer.sa_layer_norm,  # after the attention add
            norm_mlp=layer.output_layer_norm,  # after the MLP add
        )

    def mlp_sublayer(self, block: nn.Module) -> dict[str, nn.Module]:
        layer: Any = block
        return {"ffn": layer.ffn, "output_layer_norm": layer.output_layer_norm}

    def run_mlp_sublayer(
        self, modules: Mapping[str, nn.Module], hidden: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = modules["output_layer_norm"](modules["ffn"](hidden) + hidden)
        return out

    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        block: Any = self.blocks(model)[layer]
        if heads == 0:
            from uqcompress.models.no_heads import NoHeadsAttention

            block.attention = NoHeadsAttention(
                "out_lin",
                q_lin=parts.query,
                k_lin=parts.key,
                v_lin=parts.value,
                out_lin=parts.output,
            )
            return
        attention = block.attention
        attention.q_lin, attention.k_lin = parts.query, parts.key
        attention.v_lin, attention.out_lin = parts.value, parts.output
        attention.n_heads = heads  # informational: the forward infers heads from the width

    def head_parts(self, model: nn.Module) -> HeadParts:
        root: Any = model
        return HeadParts(final_norm=None, pooler=root.pre_classifier, classifier=root.classifier)

    def head_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        root: Any = model
        return {
            "pre_classifier": root.pre_classifier,
            "head_dropout": root.dropout,
            "classifier": root.classifier,
        }

    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        import torch

        pooled = torch.relu(modules["pre_classifier"](hidden[:, 0]))  # [B, d]
        logits: torch.Tensor = modules["classifier"](modules["head_dropout"](pooled))
        return logits


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (DistilBertFamily(),)
