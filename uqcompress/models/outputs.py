"""One way to read predictions from any model we run: member logits `[B, M, C]`.

A classifier is M = 1; a fused Hydra model returns its M members' logits directly. Everything
that consumes logits (training loss, eval, export graph, finetune validation) reads them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.utils import ModelOutput


@dataclass
class MemberOutput(ModelOutput):
    """What an ensemble model (Hydra, SVE) returns. Shape: member_logits `[B, M, C]`."""

    member_logits: torch.Tensor | None = None


def member_logits(model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """Shape: model inputs `[B, ...]` -> member logits `[B, M, C]`."""
    output = model(**inputs)
    fused = getattr(output, "member_logits", None)
    if fused is not None:
        return fused
    return output.logits.unsqueeze(1)
