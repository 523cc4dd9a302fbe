"""Member-wise linear maps for ensembles that fold their members into the batch (Hydra, SVE).

Rows are member-major: `[M*B, ...]` is M blocks of B. Weights are stored `[M, in, out]` and
applied with one batched GEMM over the member axis (ONNX `MatMul`, not `Einsum`).
"""

from __future__ import annotations

import torch
from torch import nn


class GroupedLinear(nn.Module):
    """M independent linear maps, one per member, applied in one batched matmul.

    Shape: x `[M*B, ..., in]` (member-major) -> `[M*B, ..., out]`.
    """

    def __init__(self, members: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.members = members
        self.weight = nn.Parameter(torch.zeros(members, in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(members, 1, out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        grouped = x.reshape(self.members, -1, x.shape[-1])  # [M, B*..., in]
        # One batched GEMM with the bias folded in (exported as MatMul + Add).
        out = torch.baddbmm(self.bias, grouped, self.weight)
        return out.reshape(*lead, self.weight.shape[-1])
