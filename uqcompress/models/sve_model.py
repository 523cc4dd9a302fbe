"""The Singular Value Ensemble model (docs/methods/sve.md): M members that share every
weight's singular vectors and differ only in their singular values, biases and classifier heads.

Each target linear becomes an `SVDLinear` holding U and V as frozen buffers, stored once, and
per member a singular-value vector (clamped at 0 in the forward pass) and a bias. Members
travel folded into the batch (`[M*B, ...]`, member-major): the forward is `x V`, scaled per
member, then `U^T`, so no member's dense weight is ever materialised while training.

The layout (`SVESpec`) lives in the transformers config under `uqc_sve`, so `sve_skeleton`
rebuilds the shapes of a saved model before its weights load; `SVE` at the end declares the
kind to the registry (`models/kinds.py`). Building one from a trained
classifier (targets, ranks, noise) is the method, in `methods/sve.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from uqcompress.models.grouped import GroupedLinear
from uqcompress.models.kind_base import SVE_KEY, ModelKind  # SVE_KEY: the SVESpec's field
from uqcompress.models.outputs import MemberOutput

if TYPE_CHECKING:
    from uqcompress.models.families import Family


@dataclass(frozen=True)
class SVESpec:
    """The SVE layout: which linears are decomposed, at which rank, for how many members."""

    members: int
    targets: list[str]  # module names, as in named_modules()
    ranks: list[int]  # per target
    sigma_init: float
    seed: int
    # Per target: whether its SVD layer has per-member biases. The paper's SVE trains the
    # existing biases only (a layer without one gets none); None: every target has them (as
    # every SVE made before `biases` was recorded, and with --extra-biases).
    biases: list[bool] | None = None

    def has_bias(self, index: int) -> bool:
        return True if self.biases is None else self.biases[index]

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "members": self.members,
            "targets": self.targets,
            "ranks": self.ranks,
            "sigma_init": self.sigma_init,
            "seed": self.seed,
        }
        if self.biases is not None:
            raw["biases"] = self.biases
        return raw

    @classmethod
    def from_config(cls, config: Any) -> SVESpec:
        raw = getattr(config, SVE_KEY)
        return cls(
            members=int(raw["members"]),
            targets=[str(t) for t in raw["targets"]],
            ranks=[int(r) for r in raw["ranks"]],
            sigma_init=float(raw["sigma_init"]),
            seed=int(raw["seed"]),
            biases=[bool(b) for b in raw["biases"]] if raw.get("biases") is not None else None,
        )


class SVDLinear(nn.Module):
    """A linear layer W = U diag(s_m) V^T + b_m per member, computed in factorised form.

    Shape: x `[M*B, ..., in]` (member-major) -> `[M*B, ..., out]`.
    """

    u: torch.Tensor
    v: torch.Tensor
    # The training loop never decays these (`train.parameter_groups`): decay would shrink the
    # pretrained spectrum towards 0 instead of regularising the members' differences.
    NO_WEIGHT_DECAY = ("singular_values",)

    bias: nn.Parameter | None

    def __init__(
        self, members: int, in_features: int, out_features: int, rank: int, bias: bool = True
    ) -> None:
        super().__init__()
        self.members, self.in_features, self.out_features = members, in_features, out_features
        # Buffers: saved with the model, never trained (no gradient, not in the optimiser).
        self.register_buffer("u", torch.zeros(out_features, rank))
        self.register_buffer("v", torch.zeros(in_features, rank))
        self.singular_values = nn.Parameter(torch.zeros(members, rank))
        if bias:
            self.bias = nn.Parameter(torch.zeros(members, out_features))
        else:
            self.register_parameter("bias", None)

    @property
    def rank(self) -> int:
        return int(self.u.shape[1])

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        members: int,
        rank: int,
        sigma_init: float,
        generator: torch.Generator,
        bias: bool = True,
    ) -> SVDLinear:
        """Decompose `linear` (float64 SVD, truncated to `rank`) and draw the members' noise;
        without `bias`, no per-member bias (the bias noise is drawn all the same, so the
        other layers' draws do not depend on it)."""
        weight = linear.weight.detach().to(torch.float64).cpu()
        u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        layer = cls(members, linear.in_features, linear.out_features, rank, bias)
        base_bias = (
            linear.bias.detach().to(torch.float64).cpu()
            if linear.bias is not None
            else torch.zeros(linear.out_features, dtype=torch.float64)
        )
        eps = torch.randn(members, rank, generator=generator, dtype=torch.float64) * sigma_init
        rms = float(base_bias.pow(2).mean().sqrt()) if base_bias.numel() else 0.0
        bias_scale = sigma_init * rms
        eta = torch.randn(members, linear.out_features, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            layer.u.copy_(u[:, :rank])
            layer.v.copy_(vh[:rank].t())
            layer.singular_values.copy_(s[:rank] * (1 + eps))
            if layer.bias is not None:
                layer.bias.copy_(base_bias + eta * bias_scale)
        layer = layer.to(linear.weight.device, linear.weight.dtype)
        # The trained parts stay float32 in a half-precision model (--dtype): an 8-bit
        # mantissa cannot hold the small steps that move a singular value away from its
        # pretrained size. U and V, frozen, keep the model's dtype (they are its memory).
        layer.singular_values.data = layer.singular_values.data.float()
        if layer.bias is not None:
            layer.bias.data = layer.bias.data.float()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        z = torch.matmul(x.reshape(self.members, -1, self.in_features), self.v)  # [M, N, r]
        z = z * self.singular_values.clamp(min=0).to(z.dtype)[:, None, :]
        out = torch.matmul(z, self.u.t())  # [M, N, out]
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)[:, None, :]
        return out.reshape(*lead, self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """Shape: `[M, in, out]`, each member's V diag(s_m) U^T (what `materialize` stores)."""
        scaled = self.v[None] * self.singular_values.clamp(min=0)[:, None, :]  # [M, in, r]
        return torch.matmul(scaled, self.u.t())


class SVEModel(nn.Module):
    """The base classifier with SVD layers and one head per member. Call it like the base
    classifier; it repeats the inputs per member and returns `MemberOutput`.

    Shape: inputs `[B, ...]` -> member_logits `[B, M, C]`.
    """

    def __init__(self, inner: nn.Module, spec: SVESpec) -> None:
        super().__init__()
        self.inner = inner
        self.spec = spec
        self.config = getattr(inner, "config", None)
        freeze_all_but_members(self)

    @property
    def members(self) -> int:
        return self.spec.members

    def forward(self, **inputs: Any) -> MemberOutput:
        m = self.members
        repeated = {
            key: value.repeat(m, *([1] * (value.dim() - 1)))  # member-major [M*B, ...]
            for key, value in inputs.items()
            if isinstance(value, torch.Tensor) and key != "labels"
        }
        logits = self.inner(**repeated).logits  # [M*B, C]
        batch = logits.shape[0] // m
        return MemberOutput(member_logits=logits.reshape(m, batch, -1).transpose(0, 1))


def freeze_all_but_members(model: nn.Module) -> None:
    """Only singular values, member biases and heads train; everything else stays frozen."""
    for param in model.parameters():
        param.requires_grad_(False)
    for module in model.modules():
        if isinstance(module, (SVDLinear, GroupedLinear)):
            for param in module.parameters():
                param.requires_grad_(True)


def install_layers(
    inner: Any,
    spec: SVESpec,
    generator: torch.Generator | None,
    classifier: str,
    fresh_heads: float | None = None,
) -> None:
    """Swap the spec's targets for SVD layers and the head (the module named `classifier`)
    for M heads, through surgery: with a generator, decomposed from the current weights
    (`SVDLinear.from_linear`), else as empty shapes for loading. The M heads are copies of
    the head, or, with `fresh_heads` (a standard deviation) and a generator, each member's
    own draw: weights ~ N(0, fresh_heads^2), bias 0, one after another from the generator."""
    from uqcompress.models.surgery import replace_module

    for index, (name, rank) in enumerate(zip(spec.targets, spec.ranks, strict=True)):
        linear = inner.get_submodule(name)
        bias = spec.has_bias(index)
        if generator is None:
            layer = SVDLinear(spec.members, linear.in_features, linear.out_features, rank, bias)
        else:
            layer = SVDLinear.from_linear(
                linear, spec.members, rank, spec.sigma_init, generator, bias
            )
        replace_module(inner, name, layer)
    head: nn.Linear = inner.get_submodule(classifier)
    heads = GroupedLinear(spec.members, head.in_features, head.out_features)
    with torch.no_grad():
        if fresh_heads is not None and generator is not None:
            drawn = torch.randn(
                heads.weight.shape, generator=generator, dtype=torch.float64
            )  # [M, in, out]
            heads.weight.copy_(drawn * fresh_heads)
            heads.bias.zero_()
        else:
            heads.weight.copy_(head.weight.t().expand(spec.members, -1, -1))
            if head.bias is not None:
                heads.bias.copy_(head.bias.expand(spec.members, 1, -1))
    replace_module(inner, classifier, heads.to(head.weight.device, head.weight.dtype))


def sve_skeleton(config: Any, family: Family) -> SVEModel:
    """An SVE model with the shapes its config records (weights to be loaded)."""
    from uqcompress.models.surgery import classifier_skeleton

    spec = SVESpec.from_config(config)
    inner: Any = classifier_skeleton(config, family)  # an SVE of a pruned model: its heads
    install_layers(inner, spec, None, family.classifier_name(inner))
    return SVEModel(inner, spec)


def _sve_summary(loaded: Any) -> dict[str, Any]:
    spec, inner = loaded.model.spec, loaded.model.inner
    full = [
        min(inner.get_submodule(n).in_features, inner.get_submodule(n).out_features)
        for n in spec.targets
    ]
    return {
        "members": loaded.members,
        "method": "sve",
        "sve_targets": len(spec.targets),
        "sve_rank": "full" if spec.ranks == full else spec.ranks[0],
        "sigma_init": spec.sigma_init,
    }


SVE = ModelKind(
    name="sve",
    key=SVE_KEY,
    described="a Singular Value Ensemble",
    noun="SVE model",
    remake="uqc svd-ensemble",
    skeleton=sve_skeleton,
    ensemble=True,
    refusal="{step} the base model the ensemble was built from",
    summarise=_sve_summary,
)
