"""BERT-family text classifiers (BERT, MiniLM, and other `model_type == "bert"` checkpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import (
    BLOCK_SHAPE_KEYS,
    AttentionParts,
    BlockParts,
    DropoutSites,
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


class BertLayoutFamily(Family):
    """BERT's post-LN encoder blocks under `model.<backbone>`: `embeddings` ->
    `encoder.layer[i]` (attention `attention.self.{query,key,value}` with its add and LayerNorm
    in `attention.output`, MLP `intermediate` -> `output` with its add and LayerNorm).

    BERT, RoBERTa, XLM-RoBERTa and ELECTRA share it; each names its backbone attribute and
    its own head.
    """

    backbone: ClassVar[str]
    shape_keys: ClassVar[tuple[str, ...]] = (
        *BLOCK_SHAPE_KEYS,
        "layer_norm_eps",
        "vocab_size",
        "max_position_embeddings",
        "type_vocab_size",
    )

    def _backbone(self, model: nn.Module) -> Any:
        return getattr(model, self.backbone)  # transformers modules are untyped trees

    def classifier_dropout(self, config: PretrainedConfig) -> float:
        dropout = getattr(config, "classifier_dropout", None)
        return float(dropout if dropout is not None else config.hidden_dropout_prob)

    def embeddings(self, model: nn.Module) -> nn.Module:
        embeddings: nn.Module = self._backbone(model).embeddings
        return embeddings

    def embed(
        self, embeddings: nn.Module, inputs: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        import torch

        ids = inputs["input_ids"]
        types = inputs.get("token_type_ids")
        hidden = embeddings(
            input_ids=ids, token_type_ids=types if types is not None else torch.zeros_like(ids)
        )
        return hidden, additive_mask(inputs.get("attention_mask"), hidden.dtype)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(self._backbone(model).encoder.layer)

    def attention_parts(self, block: nn.Module, head_dim: int) -> AttentionParts:
        layer: Any = block
        return AttentionParts(
            query=layer.attention.self.query,
            key=layer.attention.self.key,
            value=layer.attention.self.value,
            output=layer.attention.output.dense,
            head_dim=head_dim,
        )

    def block_parts(self, block: nn.Module, config: PretrainedConfig) -> BlockParts:
        layer: Any = block
        return BlockParts(
            attention=self.attention_parts(block, config_head_dim(config)),
            mlp=MlpParts(
                up=layer.intermediate.dense,
                down=layer.output.dense,
                activation=str(config.hidden_act),
            ),
            norm_attention=layer.attention.output.LayerNorm,  # after the attention add
            norm_mlp=layer.output.LayerNorm,  # after the MLP add
        )

    def mlp_sublayer(self, block: nn.Module) -> dict[str, nn.Module]:
        layer: Any = block
        return {"intermediate": layer.intermediate, "output": layer.output}

    def run_mlp_sublayer(
        self, modules: Mapping[str, nn.Module], hidden: torch.Tensor
    ) -> torch.Tensor:
        # BertOutput (and its copies) does the dense, dropout, residual add and LayerNorm.
        out: torch.Tensor = modules["output"](modules["intermediate"](hidden), hidden)
        return out

    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        block: Any = self.blocks(model)[layer]
        attention = block.attention
        if heads == 0:
            from uqcompress.models.no_heads import NoHeadsSelfAttention

            attention.self = NoHeadsSelfAttention(parts.query, parts.key, parts.value)
        else:
            core = attention.self
            core.query, core.key, core.value = parts.query, parts.key, parts.value
            core.num_attention_heads = heads
            core.all_head_size = parts.query.out_features
        attention.output.dense = parts.output

    def max_length(self, config: PretrainedConfig) -> int | None:
        return int(config.max_position_embeddings)


class ClassificationHeadFamily(BertLayoutFamily):
    """A BERT-layout family whose head is one module `classifier` reading the first token:
    `out_proj(dropout(act(dense(dropout(h[:, 0])))))` (RoBERTa: tanh, ELECTRA: gelu)."""

    def head_parts(self, model: nn.Module) -> HeadParts:
        root: Any = model
        head = root.classifier
        return HeadParts(final_norm=None, pooler=head.dense, classifier=head.out_proj)

    def head_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        root: Any = model
        return {"classifier": root.classifier}

    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits: torch.Tensor = modules["classifier"](hidden)  # reads hidden[:, 0] itself
        return logits


class BertFamily(BertLayoutFamily):
    """Post-LN encoder: `bert.embeddings` -> `bert.encoder.layer[i]` (attention with its add
    and LayerNorm in `attention.output`, MLP `intermediate` -> `output` with its add and
    LayerNorm) -> `bert.pooler` (dense + tanh on [CLS]) -> `dropout` -> `classifier`."""

    name = "bert"
    backbone = "bert"
    model_types = ("bert",)
    input_kind = "text"
    dropout_sites = DropoutSites(classifier=True)  # `dropout` before the classifier
    layout = Layout(
        norm_order="post",
        norm="layernorm",
        gated_mlp=False,
        final_norm=False,
        pooler_activation="tanh",
    )
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
        ),
        "small": dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
            max_position_embeddings=512,
        ),
        "base": dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
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
        from transformers import BertConfig

        values = text_config_values(self.presets[preset], overrides)
        return BertConfig(**label_fields(labels), **values)

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import BertForSequenceClassification

        return BertForSequenceClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.bert.modeling_bert import BertEmbeddings

        return BertEmbeddings(config)

    # The head under the backbone's name, so a BERT copy (another backbone) inherits it.
    def head_parts(self, model: nn.Module) -> HeadParts:
        root: Any = model
        pooler = self._backbone(model).pooler.dense
        return HeadParts(final_norm=None, pooler=pooler, classifier=root.classifier)

    def head_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        root: Any = model
        return {
            "pooler": self._backbone(model).pooler,  # reads [CLS] itself
            "head_dropout": root.dropout,
            "classifier": root.classifier,
        }

    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        pooled = modules["pooler"](hidden)  # [B, d]: tanh(dense(hidden[:, 0]))
        logits: torch.Tensor = modules["classifier"](modules["head_dropout"](pooled))
        return logits


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (BertFamily(),)
