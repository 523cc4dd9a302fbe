"""What a model family must say about itself: presets, config, classes, where modules live."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

InputKind = Literal["text", "image"]


def config_head_dim(config: Any) -> int:
    """Width d_h of one attention head: `config.head_dim` where the config sets it (families
    whose heads are not hidden / heads wide), else `hidden_size // num_attention_heads`.

    The one place head_dim is read: gates, surgery, scoring, the Hydra model and DIRECTOR's
    transition all use it, so a family with its own head width needs no edit elsewhere.
    """
    explicit = getattr(config, "head_dim", None)
    if explicit:
        return int(explicit)
    return int(config.hidden_size) // int(config.num_attention_heads)


@dataclass(frozen=True)
class AttentionParts:
    """The projections of one attention layer: what head gates, scoring, pruning and Hydra
    fusion read, and what `Family.set_attention_layer` installs after pruning."""

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    output: nn.Linear


class Family(ABC):
    """One transformers architecture family. Adding a family = one new file like bert.py."""

    name: str
    model_types: tuple[str, ...]
    input_kind: InputKind
    presets: ClassVar[dict[str, dict[str, Any]]]

    @abstractmethod
    def build_config(
        self,
        preset: str,
        overrides: dict[str, Any],
        labels: list[str],
        image_size: int | None = None,
        patch_size: int | None = None,
    ) -> PretrainedConfig:
        """A transformers config for a new, untrained classifier."""

    @abstractmethod
    def classifier_class(self) -> type[PreTrainedModel]:
        """The transformers class of this family's classifier."""

    @abstractmethod
    def attention_layers(self, model: nn.Module) -> list[AttentionParts]:
        """The attention projections of every layer, in layer order."""

    @abstractmethod
    def set_attention_layer(
        self, model: nn.Module, layer: int, parts: AttentionParts, heads: int
    ) -> None:
        """Install new projections for `heads` heads in `layer` (only surgery.py calls this).

        With `heads == 0` the attention core is replaced by a module that returns the output
        projection's bias: exactly what the fully gated layer computes, without the zero-head
        reshape that crashes transformers' attention.
        """

    def max_length(self, config: PretrainedConfig) -> int | None:
        """The longest input (tokens) the model accepts; None for images."""
        return None
