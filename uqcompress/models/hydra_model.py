"""The fused Hydra network: M pruned members of one classifier in a single forward pass.

Layout: the members travel folded into the batch, member-major, as `[M*B, T, d]`.
Embeddings run once and are repeated M times (after the trunk, `fuse --shared-layers K`: the
first K blocks then run once on one stream `[B, T, d]`, with every head some member kept
there). Per member layer:

- attention projections are grouped fully-connected layers, weights `[M, in, out]` applied with
  one batched `torch.matmul` over the member axis (exported as ONNX `MatMul`, not `Einsum`);
- one attention call covers every member's heads; a head only sees its own member's stream;
- uneven head counts are padded to the layer's largest member with exact zeros: a padded head
  has zero Q/K/V columns and zero output-projection rows, so it adds exactly 0 (and receives
  zero gradient, so fine-tuning keeps it zero);
- LayerNorms are per member (`[M, d]`), the MLP is one shared (averaged) `nn.Linear` pair,
  or, for members narrowed by `prune --mlp-ratio` (`HydraSpec.member_mlps`), each member's
  own narrower MLP;
- every member has its own classifier (and its own pooler where the family has one).

What it builds follows the family's anatomy (`Family.layout`: norm order, final norm, pooler;
`Family.embed` for the inputs), so it knows no family by name.

The configuration lives in the transformers config under `uqc_hydra`, so a Hydra model is
saved and loaded like any other model artifact (see `models/loading.py`); `HYDRA` at the end
declares the kind to the registry (`models/kinds.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from uqcompress.models.families import FAMILIES, Family, family_named
from uqcompress.models.families.base import (
    BlockSizes,
    config_head_dim,
    last_token_index,
    rotate,
)
from uqcompress.models.grouped import GroupedLinear
from uqcompress.models.kind_base import HYDRA_KEY, ModelKind  # HYDRA_KEY: the HydraSpec's field
from uqcompress.models.outputs import MemberOutput


def hydra_supports(family: Family) -> bool:
    """Whether the fused layers below can express `family`: LayerNorm or RMSNorm blocks
    (pre- or post-norm, with or without layer scale), a plain or gated MLP, attention with or
    without rotary positions, grouped key/value heads and per-head q/k norms, and a head that
    reads the first token (optionally beside the mean of the others, optionally through a
    dense pooler) or the last real token. Every registered family, today; a family outside
    these gets a refusal, not a wrong model."""
    layout = family.layout
    return layout.norm in ("layernorm", "rmsnorm")


def hydra_refusal(family: Family) -> str | None:
    """Why models of `family` cannot be fused, in one line; None if they can."""
    if not hydra_supports(family):
        return (
            f"Hydra does not support the {family.name} family (it fuses LayerNorm or RMSNorm "
            "blocks)"
        )
    return None


def hydra_families() -> tuple[str, ...]:
    """Names of the registered families Hydra can fuse (for refusal hints)."""
    return tuple(name for name, family in FAMILIES.items() if hydra_supports(family))


@dataclass(frozen=True)
class HydraSpec:
    """What the fused model is made of: M members and, per member and layer, the ORIGINAL
    indices of the heads it kept (their order is the order of the member's head slots).

    With `shared_layers` K > 0 the first K blocks are a trunk run once, on one stream, with
    the union of the members' heads there (`trunk_heads`); the members branch after it.
    """

    members: int
    kept_heads: list[list[list[int]]]  # [M][L] -> head indices
    shared_layers: int = 0
    # Query heads per key/value head in the base model when K/V are laid out per key/value
    # head (grouped-query attention, `kv_layout: grouped`); 1: one K/V copy per query slot,
    # the layout of models fused before the grouped layout existed (and of non-GQA models).
    group: int = 1
    # Each member keeps its own MLP (members narrowed by `prune --mlp-ratio`: each kept its
    # own intermediate neurons) instead of sharing one averaged MLP.
    member_mlps: bool = False

    @property
    def layers(self) -> int:
        return len(self.kept_heads[0])

    def shared(self, layer: int) -> bool:
        """Whether `layer` is in the trunk (run once for every member)."""
        return layer < self.shared_layers

    def trunk_heads(self, layer: int) -> list[int]:
        """The heads of trunk layer `layer`: every head some member kept there, in order."""
        return sorted({h for member in self.kept_heads for h in member[layer]})

    def layer_heads(self, layer: int) -> list[list[int]]:
        """The head lists of `layer`'s streams: the trunk's alone, or each member's."""
        if self.shared(layer):
            return [self.trunk_heads(layer)]
        return [member[layer] for member in self.kept_heads]

    def kv_group(self, layer: int) -> int:
        """Query slots per key/value slot in `layer`.

        Grouped (> 1) when every stream reads its key/value heads evenly and the layout
        costs no extra query slot: stream m keeps `kv_m` key/value heads read by `g_m` query
        heads each, and the layer's `max kv_m` x `max g_m` equals its widest stream (always
        so after `prune --unit kv` or `--unit query`). Then K/V are projected once per
        key/value head and a query slot reads its group's by index (`enable_gqa`). Otherwise
        1: K/V columns are copied per query slot (exact, at Q's cost)."""
        if self.group <= 1:
            return 1
        streams = [heads for heads in self.layer_heads(layer) if heads]
        if not streams:
            return 1
        kv_counts = [len({h // self.group for h in heads}) for heads in streams]
        groups = [len(heads) // kv for heads, kv in zip(streams, kv_counts, strict=True)]
        uneven = any(
            len(heads) != kv * g for heads, kv, g in zip(streams, kv_counts, groups, strict=True)
        )
        widest = max(len(heads) for heads in streams)
        if uneven or max(kv_counts) * max(groups) != widest:
            return 1
        return max(groups)

    def kv_slots(self, layer: int) -> int:
        """Key/value head slots in `layer` (its query slots over `kv_group`)."""
        return self.slots(layer) // self.kv_group(layer)

    def slots(self, layer: int) -> int:
        """Head slots in `layer`: the trunk's heads in a shared layer, else the largest
        member's head count there."""
        if self.shared(layer):
            return len(self.trunk_heads(layer))
        return max(len(member[layer]) for member in self.kept_heads)

    def padding_ratio(self) -> float:
        """Share of head slots that are zero padding (compute spent on nothing)."""
        branched = range(self.shared_layers, self.layers)
        total = sum(self.slots(layer) for layer in branched) * self.members
        used = sum(len(member[layer]) for member in self.kept_heads for layer in branched)
        return 0.0 if total == 0 else (total - used) / total

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "members": self.members,
            "kept_heads": self.kept_heads,
            "aggregation": "mean_probs",
        }
        if self.shared_layers:  # absent for K = 0: configs (and ids) as before the trunk
            out["shared_layers"] = self.shared_layers
        if self.group > 1:  # absent without GQA: configs (and ids) as before
            out["kv_layout"] = "grouped"
        if self.member_mlps:  # absent for a shared MLP: configs (and ids) as before
            out["mlp"] = "per_member"
        return out

    @classmethod
    def from_config(cls, config: Any) -> HydraSpec:
        raw = getattr(config, HYDRA_KEY)
        kept = [[[int(h) for h in layer] for layer in member] for member in raw["kept_heads"]]
        shared = int(raw.get("shared_layers", 0))
        group = base_group_size(config) if raw.get("kv_layout") == "grouped" else 1
        own = raw.get("mlp") == "per_member"
        return cls(int(raw["members"]), kept, shared_layers=shared, group=group, member_mlps=own)


def base_group_size(config: Any) -> int:
    """Query heads per key/value head in the unpruned model (1 without grouped queries);
    pruned configs keep the base's head counts."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    return max(heads // kv, 1)


class MemberScale(nn.Module):
    """Layer scale with its own `[d]` vector per member (DINOv2's `layer_scale1/2`).

    Shape: x `[M*B, ..., d]` (member-major) -> same.
    """

    def __init__(self, members: int, hidden: int) -> None:
        super().__init__()
        self.members = members
        self.weight = nn.Parameter(torch.ones(members, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.shape[-1]
        return (x.reshape(self.members, -1, hidden) * self.weight[:, None, :]).reshape(x.shape)


# A per-member norm over `width` features: the family's `member_norm` with M and eps bound.
NormBuilder = Callable[[int], nn.Module]


class FusedAttention(nn.Module):
    """Every member's heads in one attention call, members never mixed.

    Grouped key/value heads (GQA), `group` > 1 (`HydraSpec.kv_group`): each member keeps its
    own key/value heads, `slots / group` K/V slots, and query slot `s * group + p` reads K/V
    slot `s` (SDPA's `enable_gqa`; ONNX: an Expand of K/V activations, no projection
    FLOPs). `group` 1: one K/V slot per query slot (without GQA, or members grouped unevenly:
    a query slot's K/V columns are then a copy of those of the key/value head it reads).

    Shape: x `[M*B, T, d]`, additive mask `[B, 1, 1 or T, T]` or None, rotary cos/sin
    `[1, T, d_h]` or None -> `[M*B, T, d]`.
    """

    def __init__(
        self,
        members: int,
        hidden: int,
        slots: int,
        head_dim: int,
        dropout: float,
        qk_norm: NormBuilder | None = None,
        group: int = 1,
    ) -> None:
        super().__init__()
        self.slots, self.head_dim, self.dropout = slots, head_dim, dropout
        self.group, self.kv_slots = group, slots // group
        width, kv_width = slots * head_dim, self.kv_slots * head_dim
        # Q, K and V of every member in one grouped GEMM: columns [Q | K | V].
        self.split = (width, kv_width, kv_width)
        self.qkv = GroupedLinear(members, hidden, width + 2 * kv_width)
        self.output = GroupedLinear(members, width, hidden)
        # Per-head norms over head_dim on queries and keys (Qwen3), per member.
        self.query_norm = qk_norm(head_dim) if qk_norm else None
        self.key_norm = qk_norm(head_dim) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if self.slots == 0:
            # No member has a head here: the layer adds its output biases only (what
            # transformers' fully gated layer computes), without zero-sized attention.
            grouped = torch.zeros_like(x).reshape(self.output.members, -1, x.shape[-1])
            return (grouped + self.output.bias).reshape(x.shape)
        rows, length, _ = x.shape
        members = self.output.members
        query, key, value = self.qkv(x).split(self.split, dim=-1)
        query = query.reshape(rows, length, self.slots, self.head_dim)
        key = key.reshape(rows, length, self.kv_slots, self.head_dim)
        value = value.reshape(rows, length, self.kv_slots, self.head_dim)
        if self.query_norm is not None and self.key_norm is not None:
            query, key = self.query_norm(query), self.key_norm(key)
        # [M*B, T, heads, d_h] -> [B, M*heads, T, d_h]: the members' heads side by side on the
        # head axis, so the batch's one mask [B, 1, 1 or T, T] broadcasts over them (not copied
        # M times). Under GQA query head m*S + s*g + p reads K/V head m*S_kv + s: its own
        # member's, as SDPA maps query head h to K/V head h // g.
        batch = rows // members
        query, key, value = (
            t.reshape(members, batch, length, -1, self.head_dim)
            .permute(1, 0, 3, 2, 4)
            .reshape(batch, -1, length, self.head_dim)
            for t in (query, key, value)
        )
        if rotary is not None:
            query, key = rotate(query, *rotary), rotate(key, *rotary)
        attended = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.kv_slots != self.slots,
        )  # [B, M*S, T, d_h]
        merged = (
            attended.reshape(batch, members, self.slots, length, self.head_dim)
            .permute(1, 0, 3, 2, 4)
            .reshape(rows, length, self.slots * self.head_dim)
        )
        return self.output(merged)


def feed_forward(
    x: torch.Tensor,
    up: nn.Module,
    down: nn.Module,
    gate: nn.Module | None,
    activation: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """`down(act(up(x)))`, or gated (SwiGLU) `down(act(gate(x)) * up(x))`.

    Shape: x `[..., d]` -> `[..., d]`.
    """
    inner = activation(gate(x)) * up(x) if gate is not None else activation(up(x))
    out: torch.Tensor = down(inner)
    return out


class MemberMlp(nn.Module):
    """One member's own MLP (members narrowed by `prune --mlp-ratio`): `down(act(up(x)))`,
    or gated `down(act(gate(x)) * up(x))`.

    Shape: x `[..., d]` -> `[..., d]`.
    """

    def __init__(self, sizes: BlockSizes) -> None:
        super().__init__()
        hidden, inner, bias = sizes.hidden, sizes.intermediate, sizes.mlp_bias
        self.gate = nn.Linear(hidden, inner, bias=bias) if sizes.gated_mlp else None
        self.up = nn.Linear(hidden, inner, bias=bias)
        self.down = nn.Linear(inner, hidden, bias=bias)
        self.activation = ACT2FN[sizes.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return feed_forward(x, self.up, self.down, self.gate, self.activation)


class HydraLayer(nn.Module):
    """One fused transformer block; the family's `layout` picks the pre-norm (ViT, decoders)
    or post-norm (BERT) order, a gated MLP, layer scales (DINOv2) and q/k norms (Qwen3), and
    its `member_norm` builds the norms.

    Shape: x `[M*B, T, d]` -> `[M*B, T, d]`.
    """

    def __init__(
        self,
        sizes: BlockSizes,
        head_dim: int,
        members: int,
        slots: int,
        family: Family,
        group: int = 1,
        member_mlps: bool = False,
    ) -> None:
        super().__init__()
        hidden, eps, layout = sizes.hidden, sizes.norm_eps, family.layout
        self.pre_norm = layout.norm_order == "pre"
        self.members = members

        def norm(width: int) -> nn.Module:
            return family.member_norm(members, width, eps)

        qk_norm = norm if layout.qk_norm else None
        self.attention = FusedAttention(
            members, hidden, slots, head_dim, sizes.attention_dropout, qk_norm, group
        )
        self.norm_attention = norm(hidden)
        self.norm_mlp = norm(hidden)
        inner, bias = sizes.intermediate, sizes.mlp_bias
        # the shared MLP, or (`member_mlps`) one MLP of its own per member
        self.member_mlps = (
            nn.ModuleList(MemberMlp(sizes) for _ in range(members)) if member_mlps else None
        )
        shared = not member_mlps
        gated = sizes.gated_mlp and shared
        self.mlp_gate = nn.Linear(hidden, inner, bias=bias) if gated else None
        self.mlp_in = nn.Linear(hidden, inner, bias=bias) if shared else None
        self.mlp_out = nn.Linear(inner, hidden, bias=bias) if shared else None
        self.activation = ACT2FN[sizes.activation]
        self.dropout = nn.Dropout(sizes.hidden_dropout)
        self.scale_attention = MemberScale(members, hidden) if layout.layer_scale else None
        self.scale_mlp = MemberScale(members, hidden) if layout.layer_scale else None

    def dense_mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The shared MLP on any rows. Shape: `[..., d]` -> `[..., d]`."""
        assert self.mlp_in is not None and self.mlp_out is not None, "members' own MLPs"
        return feed_forward(x, self.mlp_in, self.mlp_out, self.mlp_gate, self.activation)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        # One GEMM per member stream, not one over all M*B*T rows: the same arithmetic, but
        # ONNX Runtime's CPU GEMM slows down per row once the activations outgrow the caches
        # (measured: [3072, 896] x [896, 4864] takes 3.3x the time of [1024, 896], not 3x).
        # Qwen2.5-0.5B shape, vs a deep ensemble: 0.87x per member against 0.96x merged at
        # batch 8, 0.90x against 0.87x at batch 1.
        if self.members > 1:  # each member's own MLP, or the shared one per stream
            mlps: list[Callable[[torch.Tensor], torch.Tensor]] = (
                list(self.member_mlps)
                if self.member_mlps is not None
                else [self.dense_mlp] * self.members
            )
            streams = x.reshape(self.members, -1, *x.shape[1:]).unbind(0)
            out = torch.cat([mlp(s) for mlp, s in zip(mlps, streams, strict=True)], dim=0)
        else:
            out = self.dense_mlp(x)
        if self.scale_mlp is not None:
            out = self.scale_mlp(out)
        return self.dropout(out)

    def attend(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        out = self.attention(x, mask, rotary)
        if self.scale_attention is not None:
            out = self.scale_attention(out)
        return self.dropout(out)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attend(self.norm_attention(x), mask, rotary)
            return x + self.mlp(self.norm_mlp(x))
        x = self.norm_attention(x + self.attend(x, mask, rotary))  # post-norm
        return self.norm_mlp(x + self.mlp(x))


class HydraModel(nn.Module):
    """The fused ensemble. Call it like the family's classifier; it returns `MemberOutput`.

    Shape: the family's inputs `[B, ...]` (input_ids `[B, T]`, pixel_values `[B, C, H, W]`)
    -> member_logits `[B, M, C]`.
    """

    def __init__(self, config: Any, family: Family | str) -> None:
        super().__init__()
        found = family_named(family)
        refused = None if found is None else hydra_refusal(found)
        if found is None or refused is not None:
            name = family if isinstance(family, str) else family.name
            raise ValueError(refused or f"Hydra supports {hydra_families()}, not {name!r}")
        layout = found.layout
        self.config = config
        self.family = found
        self.spec = HydraSpec.from_config(config)
        sizes = found.sizes(config)
        members, hidden = self.spec.members, sizes.hidden
        self.embeddings = found.build_embeddings(config)
        # trunk layers (the first `shared_layers`) are one stream: a "member" axis of 1
        self.layers = nn.ModuleList(
            HydraLayer(
                sizes,
                config_head_dim(config),
                1 if self.spec.shared(layer) else members,
                self.spec.slots(layer),
                found,
                self.spec.kv_group(layer),
                self.spec.member_mlps and not self.spec.shared(layer),
            )
            for layer in range(self.spec.layers)
        )
        final_norm = layout.final_norm
        norm = found.member_norm
        self.final_norm = norm(members, hidden, sizes.norm_eps) if final_norm else None
        pooled = layout.pooler_activation is not None
        self.pooler = GroupedLinear(members, hidden, hidden) if pooled else None
        self.classifier_dropout = nn.Dropout(found.classifier_dropout(config))
        features = hidden * layout.pooled_width
        self.classifier = GroupedLinear(members, features, int(config.num_labels))
        activation = layout.pooler_activation  # a module without weights (e.g. tanh)
        self.pooler_activation = ACT2FN[activation] if activation is not None else None

    @property
    def members(self) -> int:
        return self.spec.members

    def pool(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """The final norm (if any) and the token(s) the head reads.

        Shape: x `[M*B, T, d]`, keep `[M*B, T]` 1/0 or None -> `[M*B, d]`, or `[M*B, 2d]`
        for `first_and_mean` pooling.
        """
        pooled = self.family.layout.pooled_token
        if pooled == "first_and_mean":
            if self.final_norm is not None:
                x = self.final_norm(x)
            return torch.cat([x[:, 0], x[:, 1:].mean(dim=1)], dim=-1)
        if pooled == "last":  # each member stream's last real token (right or left padding)
            rows, length = x.shape[:2]
            last = last_token_index(keep, rows, length).to(x.device)
            x = x[torch.arange(rows, device=x.device), last][:, None]  # [M*B, 1, d]
            return (self.final_norm(x) if self.final_norm is not None else x)[:, 0]
        first = x[:, 0]  # the CLS token of every member's stream
        # The norm is per token: norming CLS alone equals norming the sequence first.
        return self.final_norm(first) if self.final_norm is not None else first

    def forward(self, **inputs: Any) -> MemberOutput:
        m = self.members
        x, mask = self.family.embed(self.embeddings, inputs)  # [B, T, d]
        rotary = self.family.rotary_positions(self.config, x)  # shared by every layer
        for index, layer in enumerate(self.layers):
            if index == self.spec.shared_layers:  # the members branch off the trunk here
                x = x.repeat(m, 1, 1)  # [M*B, T, d], member-major (the mask stays [B, ...])
            x = layer(x, mask, rotary)
        keep = inputs.get("attention_mask")
        first = self.pool(x, keep.repeat(m, 1) if keep is not None else None)
        if self.pooler is not None:
            first = self.pooler(first)
            if self.pooler_activation is not None:
                first = self.pooler_activation(first)
        logits = self.classifier(self.classifier_dropout(first))  # [M*B, C]
        batch = logits.shape[0] // m
        return MemberOutput(member_logits=logits.reshape(m, batch, -1).transpose(0, 1))


def hydra_skeleton(config: Any, family: Family) -> HydraModel:
    """A Hydra model with the shapes its config records (weights to be loaded)."""
    return HydraModel(config, family.name)


def _hydra_summary(loaded: Any) -> dict[str, Any]:
    spec = loaded.model.spec
    return {
        "members": loaded.members,
        "method": "hydra",
        "kept_heads": spec.kept_heads,
        "head_slots_per_layer": [spec.slots(layer) for layer in range(spec.layers)],
        **(
            {"kv_slots_per_layer": [spec.kv_slots(layer) for layer in range(spec.layers)]}
            if spec.group > 1
            else {}
        ),
        "padding_ratio": round(spec.padding_ratio(), 4),
        **({"shared_layers": spec.shared_layers} if spec.shared_layers else {}),
    }


HYDRA = ModelKind(
    name="hydra",
    key=HYDRA_KEY,
    described="a fused Hydra model",
    noun="Hydra model",
    remake="uqc fuse",
    skeleton=hydra_skeleton,
    ensemble=True,
    refusal="{step} the base model before pruning members and fusing them",
    summarise=_hydra_summary,
)
