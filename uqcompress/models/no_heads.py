"""Stand-ins for attention layers left with zero heads.

transformers reshapes with `view(..., -1, head_dim)`, which cannot infer a size from zero
elements. A layer with no heads computes the output projection of an empty vector: its bias.
These modules keep the projections (as 0-sized linears, so state-dict keys stay the same and
checkpoints round-trip) and return exactly that.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class NoHeadsSelfAttention(nn.Module):
    """BERT's `attention.self` with no heads: an empty context `[B, T, 0]`; the following
    `attention.output.dense` (a `Linear(0, d)`) turns it into its bias."""

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear) -> None:
        super().__init__()
        self.query, self.key, self.value = query, key, value
        self.num_attention_heads = 0
        self.all_head_size = 0

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Shape: `[B, T, d]` -> context `[B, T, 0]`, no attention weights."""
        return hidden_states.new_zeros(*hidden_states.shape[:-1], 0), None


class NoHeadsAttention(nn.Module):
    """A whole attention module with no heads (ViT, DeiT, DINOv2, DistilBERT, decoders):
    returns the output projection's bias. The projections (and any other weights, such as
    Qwen3's q/k norms) keep the family's attribute names, so state-dict keys stay those of the
    module it replaces."""

    def __init__(self, output: str, **projections: nn.Module) -> None:
        super().__init__()
        for name, linear in projections.items():
            setattr(self, name, linear)
        self.output_name = output
        self.num_heads = 0

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Shape: `[B, T, d]` -> `[B, T, d]` (the bias at every position), no weights."""
        empty = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        output: nn.Module = getattr(self, self.output_name)
        return output(empty), None
