"""Decoder LLM classifiers: Llama (and, by subclassing, Qwen2, Qwen3, Mistral).

What differs from the encoders: pre-norm blocks with RMSNorm, rotary positions, a gated
(SwiGLU) MLP `down(act(gate(x)) * up(x))`, grouped-query attention (`num_key_value_heads`
key/value heads, each read by `num_attention_heads / num_key_value_heads` query heads), a
causal mask, and a head that normalises the sequence and scores the last real token
(`model.norm` -> `score`, no bias).

Padding: transformers picks the rightmost token that is not `pad_token_id`; the anatomy picks
the last token the attention mask keeps, the same one for right and left padding whenever no
real token equals the padding id. Positions are `0..T-1` whatever the padding, as in
transformers: rotary attention depends only on relative positions, so a left-padded text
gets the logits of the unpadded one (up to float round-off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import (
    BLOCK_SHAPE_KEYS,
    AttentionParts,
    BlockParts,
    BlockSizes,
    Family,
    HeadParts,
    Layout,
    MlpParts,
    config_head_dim,
    label_fields,
    last_token_index,
    text_config_values,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


def causal_mask(
    attention_mask: torch.Tensor | None, length: int, batch: int, dtype: torch.dtype, device: Any
) -> torch.Tensor:
    """Shape: `[B, T]` 1/0 (or None: no padding) -> additive `[B, 1, T, T]`: 0 where query i
    may attend key j (j <= i and j is a real token), dtype-min elsewhere.

    Built with `where`, not by adding two masks: min + min would overflow to -inf, and a row
    of -inf (a padding query) would turn into NaN in the softmax.
    """
    import torch

    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].to(torch.bool)
    allowed = allowed.expand(batch, 1, length, length)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


class LlamaFamily(Family):
    """Pre-norm causal decoder: `model.embed_tokens` -> `model.layers[i]` (`input_layernorm`,
    `self_attn.{q,k,v,o}_proj` with rotary positions and GQA, add; `post_attention_layernorm`,
    `mlp.{gate,up,down}_proj`, add) -> `model.norm` -> `score` on the last real token."""

    name = "llama"
    model_types: tuple[str, ...] = ("llama",)
    input_kind = "text"
    layout = Layout(
        norm_order="pre",
        norm="rmsnorm",
        gated_mlp=True,
        final_norm=True,
        pooler_activation=None,
        pooled_token="last",
        causal=True,
    )
    extra_config_keys = ()
    shape_keys: ClassVar[tuple[str, ...]] = (
        *BLOCK_SHAPE_KEYS,
        "vocab_size",
        "max_position_embeddings",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
    )
    # tiny and small for tests (GQA: 2 query heads per key/value head); base: Llama-3.2-1B's
    # shapes (its 128,256-token vocabulary only with --set vocab_size=128256).
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
        ),
        "small": dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=688,
            max_position_embeddings=512,
        ),
        "base": dict(
            hidden_size=2048,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=8192,
            max_position_embeddings=131072,
            rope_theta=500000.0,
        ),
    }

    # --- building --------------------------------------------------------------------------

    def _config_class(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig

    def _config_defaults(self) -> dict[str, Any]:
        """Values every `uqc init` model of the family gets before the preset's."""
        return {"tie_word_embeddings": False}

    def build_config(
        self,
        preset: str,
        overrides: dict[str, Any],
        labels: list[str],
        image_size: int | None = None,
        patch_size: int | None = None,
    ) -> PretrainedConfig:
        values = text_config_values(self.presets[preset], overrides, self._config_defaults())
        config: PretrainedConfig = self._config_class()(**label_fields(labels), **values)
        return config

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import LlamaForSequenceClassification

        return LlamaForSequenceClassification

    def _rotary_class(self) -> Any:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        return LlamaRotaryEmbedding

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from torch import nn

        cfg: Any = config
        return nn.Embedding(int(cfg.vocab_size), int(cfg.hidden_size), cfg.pad_token_id)

    def max_length(self, config: PretrainedConfig) -> int | None:
        # With a sliding window, the causal mask the anatomy builds is the model's own only
        # for inputs no longer than the window.
        window = getattr(config, "sliding_window", None)
        limit = int(config.max_position_embeddings)
        return min(limit, int(window)) if window else limit

    def sizes(self, config: PretrainedConfig) -> BlockSizes:
        cfg: Any = config
        return BlockSizes(
            hidden=int(cfg.hidden_size),
            intermediate=int(cfg.intermediate_size),
            norm_eps=float(cfg.rms_norm_eps),
            activation=str(cfg.hidden_act),
            attention_dropout=float(getattr(cfg, "attention_dropout", 0.0) or 0.0),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            gated_mlp=True,
        )

    def check_loadable(self, config: PretrainedConfig, where: str) -> None:
        cfg: Any = config
        heads, kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        if kv_heads < 1 or heads % kv_heads != 0:
            raise ConfigError(
                f"{where}: {heads} query heads cannot share {kv_heads} key/value heads evenly",
                hint="num_attention_heads must be a multiple of num_key_value_heads",
            )

    # --- embeddings ------------------------------------------------------------------------

    def embeddings(self, model: nn.Module) -> nn.Module:
        root: Any = model
        embeddings: nn.Module = root.model.embed_tokens
        return embeddings

    def embed(
        self, embeddings: nn.Module, inputs: Mapping[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids = inputs["input_ids"]
        hidden = embeddings(ids)
        batch, length = ids.shape
        mask = causal_mask(inputs.get("attention_mask"), length, batch, hidden.dtype, ids.device)
        return hidden, mask

    # --- blocks ----------------------------------------------------------------------------

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        root: Any = model
        return list(root.model.layers)

    def attention_parts(self, block: nn.Module, head_dim: int) -> AttentionParts:
        attention: Any = getattr(block, "self_attn")  # noqa: B009 (untyped module tree)
        return AttentionParts(
            query=attention.q_proj,
            key=attention.k_proj,
            value=attention.v_proj,
            output=attention.o_proj,
            head_dim=head_dim,
            query_norm=getattr(attention, "q_norm", None),  # Qwen3
            key_norm=getattr(attention, "k_norm", None),
        )

    def block_parts(self, block: nn.Module, config: PretrainedConfig) -> BlockParts:
        layer: Any = block
        mlp = layer.mlp
        return BlockParts(
            attention=self.attention_parts(block, config_head_dim(config)),
            mlp=MlpParts(
                up=mlp.up_proj,
                down=mlp.down_proj,
                gate=mlp.gate_proj,
                activation=str(config.hidden_act),
            ),
            norm_attention=layer.input_layernorm,
            norm_mlp=layer.post_attention_layernorm,
        )

    def rotary_positions(
        self, config: PretrainedConfig, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions 0..T-1, as the model's own rotary module computes them
        (its frequencies, scaling included, come from the config alone).

        Shape: hidden `[B, T, d]` -> cos, sin `[1, T, d_h]`.
        """
        import torch

        rotary = self._rotary_class()(config).to(hidden.device)
        positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
        cos, sin = rotary(hidden, positions)
        return cos, sin

    def run_block(
        self, block: nn.Module, hidden: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        layer: Any = block
        # The MLP keeps the config (the attention may be a no-heads stand-in after pruning).
        positions = self.rotary_positions(layer.mlp.config, hidden)
        out = block(hidden, attention_mask=mask, position_embeddings=positions)
        return out[0] if isinstance(out, tuple) else out

    def mlp_sublayer(self, block: nn.Module) -> dict[str, nn.Module]:
        layer: Any = block
        return {"norm": layer.post_attention_layernorm, "mlp": layer.mlp}

    def run_mlp_sublayer(
        self, modules: Mapping[str, nn.Module], hidden: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = hidden + modules["mlp"](modules["norm"](hidden))
        return out

    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        block: Any = self.blocks(model)[layer]
        attention = block.self_attn
        if heads == 0:
            from uqcompress.models.no_heads import NoHeadsAttention

            extra = {
                n: getattr(attention, n) for n in ("q_norm", "k_norm") if hasattr(attention, n)
            }
            block.self_attn = NoHeadsAttention(
                "o_proj",
                q_proj=parts.query,
                k_proj=parts.key,
                v_proj=parts.value,
                o_proj=parts.output,
                **extra,
            )
            return
        if heads % parts.kv_heads != 0:
            raise ValueError(
                f"layer {layer}: {heads} query heads cannot share {parts.kv_heads} key/value "
                "heads evenly"
            )
        attention.q_proj, attention.k_proj = parts.query, parts.key
        attention.v_proj, attention.o_proj = parts.value, parts.output
        # repeat_kv reads this: each kept key/value head serves this many query heads.
        attention.num_key_value_groups = heads // parts.kv_heads

    # --- head ------------------------------------------------------------------------------

    def head_parts(self, model: nn.Module) -> HeadParts:
        root: Any = model
        return HeadParts(final_norm=root.model.norm, pooler=None, classifier=root.score)

    def head_modules(self, model: nn.Module) -> dict[str, nn.Module]:
        root: Any = model
        return {"final_norm": root.model.norm, "score": root.score}

    def run_head(
        self,
        modules: Mapping[str, nn.Module],
        hidden: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        import torch

        # Scored at every position, then the last real token picked: what transformers does,
        # so the numbers are the same bits.
        scores = modules["score"](modules["final_norm"](hidden))  # [B, T, C]
        batch, length = hidden.shape[:2]
        last = last_token_index(attention_mask, batch, length).to(hidden.device)
        logits: torch.Tensor = scores[torch.arange(batch, device=hidden.device), last]
        return logits


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (LlamaFamily(),)
