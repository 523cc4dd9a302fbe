"""Mistral decoder classifiers: Llama's layout with a sliding attention window.

The window (`sliding_window`, 4096 in Mistral-7B) bounds the input length uqc feeds the model
(`LlamaFamily.max_length`), so the full causal mask of the anatomy is the model's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import Family
from uqcompress.models.families.llama import LlamaFamily

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class MistralFamily(LlamaFamily):
    """Llama's blocks under `model.layers`; sliding-window attention."""

    name = "mistral"
    model_types = ("mistral",)
    # base: Mistral-7B's shapes (32k vocabulary with --set vocab_size=32768).
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(LlamaFamily.presets["tiny"], sliding_window=64),
        "small": dict(LlamaFamily.presets["small"], sliding_window=256),
        "base": dict(
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            max_position_embeddings=32768,
            sliding_window=4096,
            rope_theta=1000000.0,
            rms_norm_eps=1e-5,
        ),
    }

    def _config_class(self) -> Any:
        from transformers import MistralConfig

        return MistralConfig

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import MistralForSequenceClassification

        return MistralForSequenceClassification

    def _rotary_class(self) -> Any:
        from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding

        return MistralRotaryEmbedding


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (MistralFamily(),)
