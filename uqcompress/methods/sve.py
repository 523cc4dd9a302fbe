"""Singular Value Ensembles (docs/methods/sve.md): M members that share every weight's
singular vectors and differ only in their singular values, biases and classifier heads.

Each target linear W = U diag(s) V^T (thin SVD, computed once in float64) becomes an
`SVDLinear` holding U and V as frozen buffers, stored once, and per member a singular-value
vector `s_m = s * (1 + eps_m)`, `eps_m ~ N(0, sigma_init^2)`, clamped at 0 in the forward
pass, and a bias `b_m = b + eta_m`, `eta_m ~ N(0, (sigma_init * rms(b))^2)` (our choice; the
paper gives no scale). Members travel folded into the batch (`[M*B, ...]`, member-major):
the forward is `x V`, scaled per member, then `U^T`, so no member's dense weight is ever
materialised while training. `materialize` turns the model into dense grouped weights for an
export that trades memory for fewer FLOPs.

Here: choosing targets and ranks, building the ensemble from a trained classifier, the dense
form for export, and parameter counts. The modules and the spec are `models/sve_model.py`.
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
from uqcompress.models.kind_base import SVE_KEY
from uqcompress.models.sve_model import (
    SVDLinear,
    SVEModel,
    SVESpec,
    install_layers,
)

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel

TARGET_PRESETS = ("default", "attention")  # default: Q/K/V/O and the MLP projections


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
    fresh_heads: bool = False,
    extra_biases: bool = False,
) -> LoadedModel:
    """The SVE model of a classifier: targets swapped for SVD layers, M heads: each a copy of
    the base head (post-hoc, on a fine-tuned classifier), or with `fresh_heads` each member's
    own random head, drawn as transformers initialises a classifier (N(0, initializer_range^2),
    bias 0) but differently per member (the paper's protocol from a pretrained backbone).
    Per-member biases only on targets that have a bias (the paper's SVE); `extra_biases`
    gives every target one (zero-initialised plus noise where it had none).
    The input `loaded` is left as it was."""

    names = resolve_targets(loaded, targets)
    inner: Any = copy.deepcopy(loaded.model)
    ranks = target_ranks(inner, names, rank)
    biases = [extra_biases or inner.get_submodule(n).bias is not None for n in names]
    spec = SVESpec(members, names, ranks, sigma_init, seed, biases)
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(loaded.config, "initializer_range", 0.02)) if fresh_heads else None
    install_layers(inner, spec, generator, loaded.family.classifier_name(inner), std)
    setattr(inner.config, SVE_KEY, spec.to_dict())
    model = SVEModel(inner, spec)
    model.eval()
    return loaded.derived(model, inner.config)


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
                if module.bias is not None:
                    grouped.bias.copy_(module.bias[:, None, :])
                else:
                    grouped.bias.zero_()
            replace_module(dense.inner, name, grouped.to(module.u.device, module.u.dtype))
    return dense


@dataclass(frozen=True)
class ParameterReport:
    base: int  # every parameter of the base model, embeddings included
    trainable: int  # singular values, member biases and heads of all M members
    # What M members add over the base as the paper counts it: (M - 1) x (one member's
    # singular values, existing biases and head); the biases added where the base had none
    # (--extra-biases) are not in it, but in `added_biases`.
    extra: int
    stored: int  # tensors in the SVE checkpoint (U and V once, members' vectors, frozen rest)
    stored_base: int  # tensors in the base checkpoint
    added_biases: int = 0  # M x out of every target whose base linear has no bias

    @property
    def overhead(self) -> float:
        """The paper's overhead: extra parameters over the base's."""
        return self.extra / self.base

    @property
    def overhead_with_added_biases(self) -> float:
        return (self.extra + self.added_biases) / self.base

    @property
    def stored_ratio(self) -> float:
        return self.stored / self.stored_base


def parameter_report(base: nn.Module, sve: SVEModel) -> ParameterReport:
    """Parameter counts of the SVE model against its base (see `ParameterReport`)."""
    members = sve.members
    per_member = added = 0
    for name, module in sve.inner.named_modules():
        if isinstance(module, (SVDLinear, GroupedLinear)):
            per_member += sum(p.numel() for p in module.parameters()) // members
        if isinstance(module, SVDLinear) and module.bias is not None:
            original: Any = base.get_submodule(name)
            if getattr(original, "bias", None) is None:  # added: not the paper's
                per_member -= module.out_features
                added += module.bias.numel()
    return ParameterReport(
        base=sum(p.numel() for p in base.parameters()),
        trainable=sum(p.numel() for p in sve.parameters() if p.requires_grad),
        extra=(members - 1) * per_member,
        stored=sum(t.numel() for t in sve.state_dict().values()),
        stored_base=sum(t.numel() for t in base.state_dict().values()),
        added_biases=added,
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
