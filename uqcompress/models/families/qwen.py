"""Qwen2 and Qwen3 decoder classifiers: Llama's layout with Qwen's differences.

Qwen2 (and Qwen2.5): biases on the query, key and value projections. Qwen3: no QKV biases but
a per-head RMSNorm on queries and keys (`self_attn.q_norm` / `k_norm`, over head_dim), and an
explicit `head_dim` wider than hidden / heads in the larger models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.models.families.base import Family, Layout
from uqcompress.models.families.llama import LlamaFamily

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Qwen2Family(LlamaFamily):
    """Llama's blocks under `model.layers`, QKV projections with biases."""

    name = "qwen2"
    model_types = ("qwen2",)
    # base: Qwen2.5-0.5B's shapes (its 151,936-token vocabulary only with --set vocab_size).
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(LlamaFamily.presets["tiny"]),
        "small": dict(LlamaFamily.presets["small"]),
        "base": dict(
            hidden_size=896,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            intermediate_size=4864,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
        ),
    }

    def _config_class(self) -> Any:
        from transformers import Qwen2Config

        return Qwen2Config

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import Qwen2ForSequenceClassification

        return Qwen2ForSequenceClassification

    def _rotary_class(self) -> Any:
        from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

        return Qwen2RotaryEmbedding


class Qwen3Family(LlamaFamily):
    """Llama's blocks with per-head q/k RMSNorm and an explicit head_dim."""

    name = "qwen3"
    model_types = ("qwen3",)
    layout = Layout(
        norm_order="pre",
        norm="rmsnorm",
        gated_mlp=True,
        final_norm=True,
        pooler_activation=None,
        pooled_token="last",
        qk_norm=True,
        causal=True,
    )
    extra_config_keys = ()
    # tiny: head_dim 16 > hidden / heads = 8, as in the larger Qwen3 models. base: Qwen3-0.6B.
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(LlamaFamily.presets["tiny"], head_dim=16),
        "small": dict(LlamaFamily.presets["small"], head_dim=32),
        "base": dict(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
        ),
    }

    def _config_class(self) -> Any:
        from transformers import Qwen3Config

        return Qwen3Config

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import Qwen3ForSequenceClassification

        return Qwen3ForSequenceClassification

    def _rotary_class(self) -> Any:
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        return Qwen3RotaryEmbedding


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (Qwen2Family(), Qwen3Family())
