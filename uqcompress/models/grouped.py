"""Member-wise linear maps for ensembles that fold their members into the batch (Hydra, SVE).

Rows are member-major: `[M*B, ...]` is M blocks of B. Weights are stored `[M, in, out]` and
applied with one batched GEMM over the member axis (`GroupedLinear`). The ONNX graph gets
the same maps as M plain GEMMs over 2-D weights (`MemberLinears`, swapped in by
`split_grouped_linears` before tracing): ONNX Runtime's CPU MatMul pre-packs a constant 2-D
weight once, but re-packs a batched `[M, in, out]` one on every call, which made the batched
form 1.5x slower per FLOP (measured on Hydra's fused Q/K/V of a BERT-base shape).
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


class MemberLinears(nn.Module):
    """A `GroupedLinear`'s M maps as M 2-D weights, each applied to its member's rows by its
    own GEMM: the same arithmetic (equal to float rounding), laid out for ONNX Runtime.

    Shape: x `[M*B, ..., in]` (member-major) -> `[M*B, ..., out]`.
    """

    def __init__(self, grouped: GroupedLinear) -> None:
        super().__init__()
        self.members = grouped.members
        self.out_features = int(grouped.weight.shape[-1])
        with torch.no_grad():
            self.weights = nn.ParameterList(
                nn.Parameter(w.clone(), requires_grad=False) for w in grouped.weight.unbind(0)
            )  # each [in, out]
            self.biases = nn.ParameterList(
                nn.Parameter(b.reshape(-1).clone(), requires_grad=False)
                for b in grouped.bias.unbind(0)
            )  # each [out]

    @property
    def bias(self) -> torch.Tensor:
        """The biases laid out as `GroupedLinear.bias` (a Hydra layer without heads adds
        them alone). Shape: `[M, 1, out]`."""
        return torch.stack(list(self.biases))[:, None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        streams = x.reshape(self.members, -1, x.shape[-1]).unbind(0)  # M x [B*..., in]
        # `s @ w + b`, not addmm: exported as MatMul + Add, which dynamic int8 quantizes
        # (a Gemm it would leave in float32); ONNX Runtime fuses the pair itself.
        out = torch.cat(
            [s @ w + b for s, w, b in zip(streams, self.weights, self.biases, strict=True)],
            dim=0,
        )
        return out.reshape(*lead, self.out_features)


def split_grouped_linears(model: nn.Module) -> int:
    """Replace, in place, every `GroupedLinear` under `model` by its `MemberLinears` (one
    module at a time, so the peak holds one module's weights twice); how many were replaced.
    For export: the model computes the same outputs, but its grouped weights are no longer
    `[M, in, out]` parameters (nothing trains or saves it afterwards)."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, GroupedLinear):
                setattr(parent, name, MemberLinears(child))
                replaced += 1
    return replaced
