"""Singular Value Ensembles (ALGORITHMS.md section 2): M members that share every weight's
singular vectors and differ only in their singular values, biases and classifier heads.

Each target linear W = U diag(s) V^T (thin SVD, computed once in float64) becomes an
`SVDLinear` holding U and V as frozen buffers, stored once, and per member a singular-value
vector `s_m = s * (1 + eps_m)`, `eps_m ~ N(0, sigma_init^2)`, clamped at 0 in the forward
pass, and a bias `b_m = b + eta_m`, `eta_m ~ N(0, (sigma_init * rms(b))^2)` (our choice; the
paper gives no scale). Members travel folded into the batch (`[M*B, ...]`, member-major):
the forward is `x V`, scaled per member, then `U^T`, so no member's dense weight is ever
materialised while training. `materialize` turns the model into dense grouped weights for an
export that trades memory for fewer FLOPs.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from uqcompress.errors import ConfigError
from uqcompress.models.grouped import GroupedLinear
from uqcompress.models.outputs import MemberOutput

if TYPE_CHECKING:
    from uqcompress.models.families import Family
    from uqcompress.models.loading import LoadedModel

SVE_KEY = "uqc_sve"  # config field holding the SVESpec as a dict
TARGET_PRESETS = ("default", "attention")  # default: Q/K/V/O and the MLP projections


@dataclass(frozen=True)
class SVESpec:
    """The SVE layout: which linears are decomposed, at which rank, for how many members."""

    members: int
    targets: list[str]  # module names, as in named_modules()
    ranks: list[int]  # per target
    sigma_init: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "members": self.members,
            "targets": self.targets,
            "ranks": self.ranks,
            "sigma_init": self.sigma_init,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config: Any) -> SVESpec:
        raw = getattr(config, SVE_KEY)
        return cls(
            members=int(raw["members"]),
            targets=[str(t) for t in raw["targets"]],
            ranks=[int(r) for r in raw["ranks"]],
            sigma_init=float(raw["sigma_init"]),
            seed=int(raw["seed"]),
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

    def __init__(self, members: int, in_features: int, out_features: int, rank: int) -> None:
        super().__init__()
        self.members, self.in_features, self.out_features = members, in_features, out_features
        # Buffers: saved with the model, never trained (no gradient, not in the optimiser).
        self.register_buffer("u", torch.zeros(out_features, rank))
        self.register_buffer("v", torch.zeros(in_features, rank))
        self.singular_values = nn.Parameter(torch.zeros(members, rank))
        self.bias = nn.Parameter(torch.zeros(members, out_features))

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
    ) -> SVDLinear:
        """Decompose `linear` (float64 SVD, truncated to `rank`) and draw the members' noise."""
        weight = linear.weight.detach().to(torch.float64).cpu()
        u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        layer = cls(members, linear.in_features, linear.out_features, rank)
        bias = (
            linear.bias.detach().to(torch.float64).cpu()
            if linear.bias is not None
            else torch.zeros(linear.out_features, dtype=torch.float64)
        )
        eps = torch.randn(members, rank, generator=generator, dtype=torch.float64) * sigma_init
        bias_scale = sigma_init * float(bias.pow(2).mean().sqrt()) if bias.numel() else 0.0
        eta = torch.randn(members, linear.out_features, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            layer.u.copy_(u[:, :rank])
            layer.v.copy_(vh[:rank].t())
            layer.singular_values.copy_(s[:rank] * (1 + eps))
            layer.bias.copy_(bias + eta * bias_scale)
        return layer.to(linear.weight.device, linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        z = torch.matmul(x.reshape(self.members, -1, self.in_features), self.v)  # [M, N, r]
        z = z * self.singular_values.clamp(min=0)[:, None, :]
        out = torch.matmul(z, self.u.t()) + self.bias[:, None, :]  # [M, N, out]
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


def is_sve_config(config: Any) -> bool:
    return getattr(config, SVE_KEY, None) is not None


def linear_names(model: nn.Module, classifier: str) -> list[str]:
    """Every non-empty linear layer except the classifier (the module named `classifier`):
    what `--targets` can name."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name != classifier and module.weight.numel() > 0
    ]


def resolve_targets(loaded: LoadedModel, spec: str) -> list[str]:
    """Module names for `--targets`: a preset (default, attention) or comma-separated regular
    expressions searched in the module names."""
    model, family = loaded.model, loaded.family
    candidates = linear_names(model, family.classifier_name(model))
    if spec in TARGET_PRESETS:
        chosen: list[nn.Module] = []
        for block in family.blocks(model):
            parts = family.block_parts(block, loaded.config)
            attention, mlp = parts.attention, parts.mlp
            chosen += [attention.query, attention.key, attention.value, attention.output]
            if spec == "default":
                chosen += [mlp.up, mlp.down] + ([mlp.gate] if mlp.gate is not None else [])
        ids = {id(m) for m in chosen}
        names = [n for n, m in model.named_modules() if id(m) in ids and n in candidates]
    else:
        patterns = []
        for raw in (p.strip() for p in spec.split(",") if p.strip()):
            try:
                patterns.append(re.compile(raw))
            except re.error as exc:
                raise ConfigError(
                    f"--targets {raw!r} is not a regular expression ({exc})",
                    hint="pass default, attention, or patterns such as 'query|key'",
                ) from exc
        names = [n for n in candidates if any(p.search(n) for p in patterns)]
    if not names:
        shapes = sorted({re.sub(r"\.\d+\.", ".N.", n) for n in candidates})
        raise ConfigError(
            f"--targets {spec!r} matches no linear layer; this model has: {', '.join(shapes)}",
            hint="pass default, attention, or a pattern matching one of those names",
        )
    return names


def target_ranks(model: nn.Module, targets: list[str], rank: int | None) -> list[int]:
    """Full rank (min(out, in)) per target, or `rank` where it fits."""
    ranks = []
    for name in targets:
        linear: Any = model.get_submodule(name)
        full = min(linear.in_features, linear.out_features)
        if rank is not None and rank > full:
            raise ConfigError(
                f"--rank {rank} is larger than {name} allows ({linear.out_features}x"
                f"{linear.in_features}: rank at most {full})",
                hint=f"pass --rank {full} or less, or --rank full",
            )
        ranks.append(full if rank is None else rank)
    return ranks


def build_sve(
    loaded: LoadedModel,
    members: int,
    targets: str,
    rank: int | None,
    sigma_init: float,
    seed: int,
) -> LoadedModel:
    """The SVE model of a classifier: targets swapped for SVD layers, M heads (each a copy of
    the base head). The input `loaded` is left as it was."""

    names = resolve_targets(loaded, targets)
    inner: Any = copy.deepcopy(loaded.model)
    ranks = target_ranks(inner, names, rank)
    spec = SVESpec(members, names, ranks, sigma_init, seed)
    generator = torch.Generator().manual_seed(seed)
    _install(inner, spec, generator, loaded.family.classifier_name(inner))
    setattr(inner.config, SVE_KEY, spec.to_dict())
    model = SVEModel(inner, spec)
    model.eval()
    return loaded.derived(model, inner.config)


def _install(inner: Any, spec: SVESpec, generator: torch.Generator | None, classifier: str) -> None:
    """Swap targets and the head (the module named `classifier`) through surgery; with a
    generator, from the current weights, else as empty shapes for loading."""
    from uqcompress.models.surgery import replace_module

    for name, rank in zip(spec.targets, spec.ranks, strict=True):
        linear = inner.get_submodule(name)
        if generator is None:
            layer = SVDLinear(spec.members, linear.in_features, linear.out_features, rank)
        else:
            layer = SVDLinear.from_linear(linear, spec.members, rank, spec.sigma_init, generator)
        replace_module(inner, name, layer)
    head: nn.Linear = inner.get_submodule(classifier)
    heads = GroupedLinear(spec.members, head.in_features, head.out_features)
    with torch.no_grad():
        heads.weight.copy_(head.weight.t().expand(spec.members, -1, -1))
        if head.bias is not None:
            heads.bias.copy_(head.bias.expand(spec.members, 1, -1))
    replace_module(inner, classifier, heads.to(head.weight.device, head.weight.dtype))


def sve_skeleton(config: Any, family: Family) -> SVEModel:
    """An SVE model with the shapes its config records (weights to be loaded)."""
    from uqcompress.models.loading import LoadedModel, labels_of
    from uqcompress.models.surgery import KEPT_HEADS_KEY, shape_to_kept_heads

    spec = SVESpec.from_config(config)
    with torch.random.fork_rng(devices=[]):
        inner: Any = family.classifier_class()(config)
    kept = getattr(config, KEPT_HEADS_KEY, None)
    if kept is not None:  # SVE of a head-pruned model
        base = LoadedModel(model=inner, family=family, config=config, labels=labels_of(config))
        shape_to_kept_heads(base, [list(map(int, layer)) for layer in kept])
    _install(inner, spec, None, family.classifier_name(inner))
    return SVEModel(inner, spec)


def materialize(model: SVEModel) -> SVEModel:
    """A copy whose SVD layers are dense grouped weights `[M, in, out]` (same function; M
    weight copies in memory, `in*out` instead of `r*(in+out)` multiply-adds per token)."""
    from uqcompress.models.surgery import replace_module

    dense = copy.deepcopy(model)
    for name, module in list(dense.inner.named_modules()):
        if isinstance(module, SVDLinear):
            grouped = GroupedLinear(module.members, module.in_features, module.out_features)
            with torch.no_grad():
                grouped.weight.copy_(module.dense_weight())
                grouped.bias.copy_(module.bias[:, None, :])
            replace_module(dense.inner, name, grouped.to(module.u.device, module.u.dtype))
    return dense


@dataclass(frozen=True)
class ParameterReport:
    base: int  # every parameter of the base model, embeddings included
    trainable: int  # singular values, member biases and heads of all M members
    extra: int  # what M members add over the base: (M - 1) x (one member's own parameters)
    stored: int  # tensors in the SVE checkpoint (U and V once, members' vectors, frozen rest)
    stored_base: int  # tensors in the base checkpoint

    @property
    def overhead(self) -> float:
        return self.extra / self.base

    @property
    def stored_ratio(self) -> float:
        return self.stored / self.stored_base


def parameter_report(base: nn.Module, sve: SVEModel) -> ParameterReport:
    """Parameter counts of the SVE model against its base (see `ParameterReport`)."""
    members = sve.members
    per_member = 0
    for module in sve.modules():
        if isinstance(module, (SVDLinear, GroupedLinear)):
            per_member += sum(p.numel() for p in module.parameters()) // members
    return ParameterReport(
        base=sum(p.numel() for p in base.parameters()),
        trainable=sum(p.numel() for p in sve.parameters() if p.requires_grad),
        extra=(members - 1) * per_member,
        stored=sum(t.numel() for t in sve.state_dict().values()),
        stored_base=sum(t.numel() for t in base.state_dict().values()),
    )


def overhead_closed_form(
    layers: int, hidden: int, intermediate: int, classes: int, members: int
) -> int:
    """Extra parameters of M members over one model, default targets, full rank, for a
    BERT/ViT block stack: per layer Q, K, V, O (d singular values and d biases each), up
    (min(d, I) values, I biases) and down (min(d, I) values, d biases); plus a head (d C + C).
    At I = 4d this is the paper's (M - 1) 15 d per layer."""
    d, i = hidden, intermediate
    per_layer = 4 * d + 2 * min(d, i) + 4 * d + i + d
    return (members - 1) * (layers * per_layer + d * classes + classes)


def overhead_paper_fraction(hidden: int, members: int) -> float:
    """The paper's per-layer overhead (M - 1) 5 / (4 d) of a block's 12 d^2 weights."""
    return (members - 1) * 5 / (4 * hidden)
