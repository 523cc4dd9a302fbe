"""RoBERTa and XLM-RoBERTa text classifiers: BERT's blocks under `roberta`, a two-layer head.

What differs from BERT: position ids are offset by the padding index (a token's position is
`padding_idx + 1 + its index`, so the longest input is `max_position_embeddings -
padding_idx - 1` tokens), one token type, and the head `classifier.dense` -> tanh ->
`classifier.out_proj` on the first token (`<s>`) instead of a pooler in the backbone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import Family, Layout, label_fields, text_config_values
from uqcompress.models.families.bert import ClassificationHeadFamily

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

# Shapes of the public checkpoints (roberta-base, xlm-roberta-base) and a tiny one for tests.
# Positions: tokens + 2 (the padding index and the offset).
_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=130,
        type_vocab_size=1,
    ),
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=514,
        type_vocab_size=1,
    ),
    "base": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=514,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
    ),
}


class RobertaFamily(ClassificationHeadFamily):
    """Post-LN encoder: `roberta.embeddings` -> `roberta.encoder.layer[i]` (BERT's blocks) ->
    `classifier` (dense + tanh + out_proj on `<s>`)."""

    name = "roberta"
    backbone = "roberta"
    model_types: tuple[str, ...] = ("roberta",)
    input_kind = "text"
    layout = Layout(
        norm_order="post",
        norm="layernorm",
        gated_mlp=False,
        final_norm=False,
        pooler_activation="tanh",
    )
    presets: ClassVar[dict[str, dict[str, Any]]] = _PRESETS

    def _config_class(self) -> Any:
        from transformers import RobertaConfig

        return RobertaConfig

    def build_config(
        self,
        preset: str,
        overrides: dict[str, Any],
        labels: list[str],
        image_size: int | None = None,
        patch_size: int | None = None,
    ) -> PretrainedConfig:
        # The shipped WordPiece vocabulary pads with id 0 (RoBERTa's own BPE pads with 1):
        # the position offset follows the padding id.
        values = text_config_values(self.presets[preset], overrides)
        config: PretrainedConfig = self._config_class()(**label_fields(labels), **values)
        return config

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import RobertaForSequenceClassification

        return RobertaForSequenceClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

        return RobertaEmbeddings(config)

    def max_length(self, config: PretrainedConfig) -> int | None:
        # Positions start at padding_idx + 1: the last usable one bounds the length.
        padding = int(config.pad_token_id or 0)
        return int(config.max_position_embeddings) - padding - 1


class XLMRobertaFamily(RobertaFamily):
    """XLM-RoBERTa: RoBERTa's architecture with a large SentencePiece vocabulary."""

    name = "xlm-roberta"
    model_types = ("xlm-roberta",)

    def _config_class(self) -> Any:
        from transformers import XLMRobertaConfig

        return XLMRobertaConfig

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import XLMRobertaForSequenceClassification

        return XLMRobertaForSequenceClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaEmbeddings

        return XLMRobertaEmbeddings(config)


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (RobertaFamily(), XLMRobertaFamily())
