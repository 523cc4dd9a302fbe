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
    """ViT's whole attention block with no heads: returns the output projection's bias."""

    def __init__(
        self, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear, o_proj: nn.Linear
    ) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.num_heads = 0

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Shape: `[B, T, d]` -> `[B, T, d]` (the bias at every position), no weights."""
        empty = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        return self.o_proj(empty), None
