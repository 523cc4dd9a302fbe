"""ELECTRA text classifiers (the discriminator fine-tuned for classification).

What differs from BERT: the embeddings can be narrower than the blocks (`embedding_size`),
with `electra.embeddings_project` taking them to `hidden_size`; no pooler; the head
`classifier.dense` -> gelu -> `classifier.out_proj` on the first token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from uqcompress.models.families.base import Family, Layout, label_fields, text_config_values
from uqcompress.models.families.bert import ClassificationHeadFamily

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel


class ProjectedEmbeddings(nn.Module):
    """ELECTRA's embeddings and, where `embedding_size != hidden_size`, the projection to the
    blocks' width: the one module whose output is the first residual stream.

    Shape: input_ids, token_type_ids `[B, T]` -> `[B, T, hidden]`.
    """

    def __init__(self, embeddings: nn.Module, project: nn.Linear | None) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.project = project

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        return self.project(hidden) if self.project is not None else hidden


class ElectraFamily(ClassificationHeadFamily):
    """Post-LN encoder: `electra.embeddings` (+ `embeddings_project`) ->
    `electra.encoder.layer[i]` (BERT's blocks) -> `classifier` (dense + gelu + out_proj)."""

    name = "electra"
    backbone = "electra"
    model_types = ("electra",)
    input_kind = "text"
    shape_keys = (*ClassificationHeadFamily.shape_keys, "embedding_size")
    layout = Layout(
        norm_order="post",
        norm="layernorm",
        gated_mlp=False,
        final_norm=False,
        pooler_activation="gelu",
    )
    # tiny keeps narrower embeddings so tests exercise the projection; small and base are
    # the shapes of google/electra-small-discriminator and -base-discriminator.
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
        ),
        "small": dict(
            embedding_size=128,
            hidden_size=256,
            num_hidden_layers=12,
            num_attention_heads=4,
            intermediate_size=1024,
            max_position_embeddings=512,
        ),
        "base": dict(
            embedding_size=768,
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
        from transformers import ElectraConfig

        values = text_config_values(self.presets[preset], overrides)
        return ElectraConfig(**label_fields(labels), **values)

    def classifier_class(self) -> type[PreTrainedModel]:
        from transformers import ElectraForSequenceClassification

        return ElectraForSequenceClassification

    def build_embeddings(self, config: PretrainedConfig) -> nn.Module:
        from transformers.models.electra.modeling_electra import ElectraEmbeddings

        cfg: Any = config
        narrower = int(cfg.embedding_size) != int(cfg.hidden_size)
        project = nn.Linear(int(cfg.embedding_size), int(cfg.hidden_size)) if narrower else None
        return ProjectedEmbeddings(ElectraEmbeddings(config), project)

    def embeddings(self, model: nn.Module) -> nn.Module:
        # A view over the model's own modules (not a copy): hooks and state dicts see them.
        backbone = self._backbone(model)
        return ProjectedEmbeddings(
            backbone.embeddings, getattr(backbone, "embeddings_project", None)
        )


# What the registry (families/__init__.py) lists from this module.
REGISTERED: tuple[Family, ...] = (ElectraFamily(),)
