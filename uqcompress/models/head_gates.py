"""Head gates and attention capture, the same way for every family.

transformers 5.x has no `head_mask`: a gate is applied by a forward pre-hook on each layer's
attention output projection, which sees the concatenated head outputs `[B, T, H_l * d_h]`
(heads in order). Multiplying head h's slice by `g[l][h]` is exact, keeps padding masks
working (the attention itself is untouched), and works for pruned models with a different
head count per layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from uqcompress.errors import ConfigError
from uqcompress.models.families.base import config_head_dim

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel


@dataclass(frozen=True)
class HeadGroups:
    """Query heads and key/value heads per layer, as a model has them now."""

    heads: list[int]
    kv_heads: list[int]

    def group_size(self, layer: int) -> int:
        """Query heads per key/value head in `layer` (0 for an empty layer)."""
        kv = self.kv_heads[layer]
        return self.heads[layer] // kv if kv else 0

    @property
    def grouped(self) -> bool:
        """Whether any layer shares a key/value head between query heads."""
        return any(self.group_size(layer) > 1 for layer in range(len(self.heads)))

    def unit_size(self, layer: int, unit: str) -> int:
        """Query heads in one unit of `layer`."""
        group = self.group_size(layer)
        if group <= 1:
            return 1
        return self.kv_heads[layer] if unit == "query" else group

    def kv_head_of_query(self) -> list[list[int]]:
        """Per layer, the key/value head each query head reads (for the scores artifact)."""
        return [
            [h // max(self.group_size(layer), 1) for h in range(heads)]
            for layer, heads in enumerate(self.heads)
        ]


def heads_per_layer(loaded: LoadedModel) -> list[int]:
    """Current head count of each layer (uneven after pruning)."""
    return [parts.heads for parts in loaded.family.attention_layers(loaded.model)]


def head_groups(loaded: LoadedModel) -> HeadGroups:
    """Query and key/value heads per layer (grouped-query attention when they differ)."""
    layers = loaded.family.attention_layers(loaded.model)
    return HeadGroups(heads=[p.heads for p in layers], kv_heads=[p.kv_heads for p in layers])


def head_dim(loaded: LoadedModel) -> int:
    """Width of one head of `loaded` (see `families.base.config_head_dim`)."""
    return config_head_dim(loaded.config)


class HeadGates:
    """Per-layer gate vectors `gates[l]` of shape `[H_l]`, applied while attached.

    Use as a context manager: ``with HeadGates(loaded) as g: g.gates[0][1] = 0; model(...)``.
    With ``requires_grad=True`` the gates are leaves, so `dL/dg` is the Taylor importance.
    """

    def __init__(self, loaded: LoadedModel, requires_grad: bool = False) -> None:
        self.loaded = loaded
        self.d_head = head_dim(loaded)
        device = next(loaded.model.parameters()).device
        self.gates: list[torch.Tensor] = [
            torch.ones(h, device=device, requires_grad=requires_grad)
            for h in heads_per_layer(loaded)
        ]
        self._handles: list[Any] = []

    def __enter__(self) -> HeadGates:
        for layer, parts in enumerate(self.loaded.family.attention_layers(self.loaded.model)):
            if parts.output is None:
                continue
            self._handles.append(parts.output.register_forward_pre_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, layer: int) -> Any:
        def apply(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            (hidden, *rest) = args
            gate = self.gates[layer].to(hidden.dtype)
            shape = hidden.shape
            # [B, T, H*d] -> [B, T, H, d], scale each head, -> [B, T, H*d]
            gated = hidden.view(*shape[:-1], gate.shape[0], self.d_head) * gate[:, None]
            return (gated.view(shape), *rest)

        return apply

    def set(self, values: list[torch.Tensor] | torch.Tensor) -> None:
        """Load gate values (a `[L, H]` tensor or a per-layer list)."""
        with torch.no_grad():
            for layer, value in enumerate(values):
                self.gates[layer].copy_(torch.as_tensor(value, dtype=self.gates[layer].dtype))


@contextmanager
def eager_attention(loaded: LoadedModel) -> Iterator[None]:
    """Switch to the eager attention implementation (the only one that returns probabilities
    in transformers 5.x: with `sdpa`, `output_attentions=True` silently returns nothing)."""
    model: Any = loaded.model
    before = getattr(model.config, "_attn_implementation", None) or "sdpa"
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def attention_probabilities(loaded: LoadedModel, outputs: Any) -> list[torch.Tensor]:
    """The per-layer attention probabilities of a forward run with `output_attentions=True`.

    Shape: one `[B, H_l, T, T]` tensor per layer. Fails clearly if they did not come back.
    """
    attentions = getattr(outputs, "attentions", None)
    expected = len(heads_per_layer(loaded))
    if attentions is None or len(attentions) != expected or any(a is None for a in attentions):
        raise ConfigError(
            f"the {loaded.family.name} model returned no attention probabilities "
            f"({0 if attentions is None else len(attentions)} of {expected} layers)",
            hint="this attention implementation cannot expose probabilities; use a model "
            "whose attention runs in transformers' eager implementation",
        )
    return list(attentions)
