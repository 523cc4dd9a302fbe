"""The torch module that gets exported: a classifier plus the uncertainty outputs.

Every model is read through `models.outputs.member_logits` (`[B, M, C]`): a classifier is
M = 1, ensembles (Hydra, SVE) return their own M; sampling models (DIRECTOR) also take their
noise as a graph input. A calibrated model's temperature is baked in: every graph divides
the member logits by T before the uncertainty outputs (T = 1 adds no node).
"""

from __future__ import annotations

import torch
from torch import nn

from uqcompress.models.outputs import member_logits
from uqcompress.uq.functional import uncertainty_outputs


class _Graph(nn.Module):
    """What every graph holds: the model and the temperature its logits are divided by."""

    def __init__(self, model: nn.Module, temperature: float = 1.0):
        super().__init__()
        self.model = model
        self.temperature = float(temperature)

    def _outputs(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Shape: member logits `[B, M, C]` -> the contract's four outputs."""
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return _outputs(logits)


def _outputs(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Shape: member logits `[B, M, C]` -> the contract's four outputs and `logits` `[B, C]`
    (contract.GRAPH_OUTPUTS)."""
    outputs = uncertainty_outputs(logits)
    return (
        logits.float(),
        outputs.probs,
        outputs.entropy,
        outputs.mutual_info,
        loader_logits(logits.float(), outputs.probs),
    )


def loader_logits(member_logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The `logits` output Hugging Face loaders read: M = 1, the member's logits; M > 1, the
    log of the mean probabilities (floored at the smallest normal float, so a probability
    that underflows to 0 stays finite), whose softmax is `probs`.

    Shape: member_logits `[B, M, C]`, probs `[B, C]` -> `[B, C]`.
    """
    if member_logits.shape[1] == 1:
        return member_logits[:, 0]
    return torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))


class TextGraph(_Graph):
    """Shape: input_ids, attention_mask, token_type_ids `[B, T]` -> member_logits `[B, M, C]`,
    probs `[B, C]`, entropy `[B]`, mutual_info `[B]`."""

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
        return self._outputs(member_logits(self.model, inputs))


class ImageGraph(_Graph):
    """Shape: pixel_values `[B, C, H, W]` -> member_logits `[B, M, C]`, probs `[B, C]`,
    entropy `[B]`, mutual_info `[B]`."""

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._outputs(member_logits(self.model, {"pixel_values": pixel_values}))


class SampledTextGraph(_Graph):
    """A sampling model (DIRECTOR) with its noise as an input.

    Shape: input_ids, attention_mask, token_type_ids `[B, T]`, noise `[B, S, K, T, d]` ->
    member_logits `[B, S, C]`, probs, entropy, mutual_info, logits.
    """

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
        return self._outputs(out.member_logits)


class SampledImageGraph(_Graph):
    """Shape: pixel_values `[B, C, H, W]`, noise `[B, S, K, T, d]` -> member_logits
    `[B, S, C]`, probs, entropy, mutual_info."""

    def forward(self, pixel_values: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._outputs(self.model(pixel_values=pixel_values, noise=noise).member_logits)


def takes_noise(model: nn.Module) -> bool:
    """Sampling models expose `noise_shape` and take their draws as an input."""
    return hasattr(model, "noise_shape")


def graph_for(model: nn.Module, input_kind: str, temperature: float = 1.0) -> nn.Module:
    """The exportable module for a model, in eval mode; `temperature` divides its logits."""
    graph: nn.Module
    if takes_noise(model):
        sampled = SampledTextGraph if input_kind == "text" else SampledImageGraph
        graph = sampled(model, temperature)
        return graph.eval()
    plain = TextGraph if input_kind == "text" else ImageGraph
    graph = plain(model, temperature)
    return graph.eval()
