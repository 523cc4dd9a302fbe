"""Norms with their own weights per member, for the Hydra model (`Family.member_norm` builds
them): members travel folded into the batch, member-major, and each one's slice of the rows is
normalised and scaled (and shifted) by its own `[d]` vectors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MemberLayerNorm(nn.Module):
    """LayerNorm with its own scale and shift per member.

    Shape: x `[M*B, ..., d]` (member-major) -> same.
    """

    def __init__(self, members: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.members, self.eps = members, eps
        self.weight = nn.Parameter(torch.ones(members, hidden))
        self.bias = nn.Parameter(torch.zeros(members, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.shape[-1]
        normed = F.layer_norm(x, (hidden,), eps=self.eps).reshape(self.members, -1, hidden)
        # scale and shift in one pass: bias + normed * weight
        out = torch.addcmul(self.bias[:, None, :], normed, self.weight[:, None, :])
        return out.reshape(x.shape)


class MemberRMSNorm(nn.Module):
    """RMSNorm (Llama's: in float32, `x / sqrt(mean(x^2) + eps)`, then the scale) with its own
    scale per member. No bias: `_stack_norm` leaves `bias` None alone.

    Shape: x `[M*B, ..., d]` (member-major) -> same.
    """

    bias: None = None

    def __init__(self, members: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.members, self.eps = members, eps
        self.weight = nn.Parameter(torch.ones(members, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype, hidden = x.dtype, x.shape[-1]
        wide = x.to(torch.float32)
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        grouped = normed.to(dtype).reshape(self.members, -1, hidden)
        return (self.weight[:, None, :] * grouped).reshape(x.shape)
