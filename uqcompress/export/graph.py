"""The torch module that gets exported: a classifier plus the uncertainty outputs.

Every method plugs in through `member_logits`: a function from the model and its inputs to
`[B, M, C]`. A single classifier is M = 1; ensembles and samplers return their own M.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from uqcompress.models.outputs import member_logits as model_member_logits
from uqcompress.uq.functional import uncertainty_outputs

MemberLogitsFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def _outputs(member_logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    outputs = uncertainty_outputs(member_logits)
    return member_logits.float(), outputs.probs, outputs.entropy, outputs.mutual_info


class TextGraph(nn.Module):
    """Shape: input_ids, attention_mask, token_type_ids `[B, T]` -> member_logits `[B, M, C]`,
    probs `[B, C]`, entropy `[B]`, mutual_info `[B]`."""

    def __init__(self, model: nn.Module, member_logits: MemberLogitsFn = model_member_logits):
        super().__init__()
        self.model = model
        self.member_logits = member_logits

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
        }
        return _outputs(self.member_logits(self.model, inputs))


class ImageGraph(nn.Module):
    """Shape: pixel_values `[B, C, H, W]` -> member_logits `[B, M, C]`, probs `[B, C]`,
    entropy `[B]`, mutual_info `[B]`."""

    def __init__(self, model: nn.Module, member_logits: MemberLogitsFn = model_member_logits):
        super().__init__()
        self.model = model
        self.member_logits = member_logits

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _outputs(self.member_logits(self.model, {"pixel_values": pixel_values}))


class SampledTextGraph(nn.Module):
    """A sampling model (DIRECTOR) with its noise as an input.

    Shape: input_ids, attention_mask, token_type_ids `[B, T]`, noise `[B, S, K, T, d]` ->
    member_logits `[B, S, C]`, probs, entropy, mutual_info.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            noise=noise,
        )
        return _outputs(out.member_logits)


class SampledImageGraph(nn.Module):
    """Shape: pixel_values `[B, C, H, W]`, noise `[B, S, K, T, d]` -> member_logits
    `[B, S, C]`, probs, entropy, mutual_info."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _outputs(self.model(pixel_values=pixel_values, noise=noise).member_logits)


def takes_noise(model: nn.Module) -> bool:
    """Sampling models expose `noise_shape` and take their draws as an input."""
    return hasattr(model, "noise_shape")


def graph_for(model: nn.Module, input_kind: str, member_logits: Any = None) -> nn.Module:
    """The exportable module for a model, in eval mode."""
    graph: nn.Module
    if takes_noise(model):
        graph = SampledTextGraph(model) if input_kind == "text" else SampledImageGraph(model)
        return graph.eval()
    fn = member_logits or model_member_logits
    graph = TextGraph(model, fn) if input_kind == "text" else ImageGraph(model, fn)
    return graph.eval()
