"""BERT-family text classifiers (BERT, MiniLM, and other `model_type == "bert"` checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import AttentionParts, Family

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


class BertFamily(Family):
    name = "bert"
    model_types = ("bert",)
    input_kind = "text"
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

        from uqcompress.models.tokenizer import shipped_vocab_size

        values: dict[str, Any] = {"vocab_size": shipped_vocab_size(), "pad_token_id": 0}
        values.update(self.presets[preset])
        values.update(overrides)
        return BertConfig(
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            **values,
        )

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import BertForSequenceClassification

        return BertForSequenceClassification

    def attention_layers(self, model: nn.Module) -> list[AttentionParts]:
        root: Any = model  # transformers modules are untyped attribute trees
        layers = root.bert.encoder.layer
        return [
            AttentionParts(
                query=layer.attention.self.query,
                key=layer.attention.self.key,
                value=layer.attention.self.value,
                output=layer.attention.output.dense,
            )
            for layer in layers
        ]

    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        root: Any = model
        attention = root.bert.encoder.layer[layer].attention
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
