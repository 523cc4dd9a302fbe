"""Hydra fusion: M differently-pruned members of one base -> one `HydraModel`.

Each member's attention projections, LayerNorms, pooler and classifier are stacked along a
member axis; the embeddings and MLPs, which pruning leaves identical and per-member
fine-tuning moves apart, are averaged (docs/methods/hydra.md), except the MLPs of members
narrowed by `prune --mlp-ratio`, which each keep their own (`own_mlps`). `shared_weight_members`
builds the reference that fusion must reproduce exactly: the members with those averages
put back in.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from uqcompress.errors import IncompatibleInputError
from uqcompress.models.families import AttentionParts
from uqcompress.models.hydra_model import (
    HYDRA_KEY,
    FusedAttention,
    HydraModel,
    HydraSpec,
    base_group_size,
    hydra_families,
    hydra_refusal,
)

if TYPE_CHECKING:
    from uqcompress.models.loading import LoadedModel


@dataclass(frozen=True)
class MemberParts:
    """The modules of one member that fusion reads, from its family's anatomy."""

    embeddings: nn.Module
    attention: list[AttentionParts]  # per layer
    norm_attention: list[nn.Module]  # pre-LN: before the attention; post-LN: after its add
    norm_mlp: list[nn.Module]
    mlp_in: list[nn.Linear]
    mlp_out: list[nn.Linear]
    mlp_gate: list[nn.Linear | None]  # gated MLPs (SwiGLU)
    attention_scale: list[torch.Tensor | None]  # per layer (layer-scale families)
    mlp_scale: list[torch.Tensor | None]
    final_norm: nn.Module | None  # families with a norm after the last block
    pooler: nn.Linear | None  # families with a dense pooler
    classifier: nn.Linear


def member_parts(loaded: LoadedModel) -> MemberParts:
    family, model = loaded.family, loaded.model
    blocks = [family.block_parts(block, loaded.config) for block in family.blocks(model)]
    head = family.head_parts(model)
    return MemberParts(
        embeddings=family.embeddings(model),
        attention=[block.attention for block in blocks],
        norm_attention=[block.norm_attention for block in blocks],
        norm_mlp=[block.norm_mlp for block in blocks],
        mlp_in=[block.mlp.up for block in blocks],
        mlp_out=[block.mlp.down for block in blocks],
        mlp_gate=[block.mlp.gate for block in blocks],
        attention_scale=[block.attention_scale for block in blocks],
        mlp_scale=[block.mlp_scale for block in blocks],
        final_norm=head.final_norm,
        pooler=head.pooler,
        classifier=head.classifier,
    )


def own_mlps(members: list[LoadedModel]) -> bool:
    """Whether the members keep MLP neurons of their own (`prune --mlp-ratio`), so that each
    keeps its MLP in the fused model instead of one averaged MLP (refused when only some do:
    the others' MLPs would be averaged with neurons they do not have)."""
    from uqcompress.models.surgery import KEPT_NEURONS_KEY

    narrowed = [getattr(m.config, KEPT_NEURONS_KEY, None) is not None for m in members]
    if any(narrowed) and not all(narrowed):
        raise IncompatibleInputError(
            f"{sum(narrowed)} of {len(members)} members have narrowed MLPs (prune "
            "--mlp-ratio) and the others do not",
            hint="fuse members made by one uqc prune --members run",
        )
    return all(narrowed)


def check_fusable(members: list[LoadedModel], names: list[str]) -> None:
    """One clear line when members cannot be one Hydra model."""
    if len(members) < 2:
        raise IncompatibleInputError(
            f"Hydra fuses several members; got {len(members)}",
            hint="make members with uqc prune SCORES --members 3",
        )
    first = members[0]
    from uqcompress.models.kinds import kind_of

    for member, name in zip(members, names, strict=True):
        if kind_of(member.config).ensemble:
            raise IncompatibleInputError(
                f"{name} is already an ensemble model (Hydra, SVE or DIRECTOR); Hydra fuses "
                "single pruned models",
                hint="make members with uqc prune SCORES --members 3",
            )
    refused = hydra_refusal(first.family)
    if refused is not None:
        raise IncompatibleInputError(
            f"{names[0]}: {refused}",
            hint=f"families Hydra fuses: {', '.join(hydra_families())}; "
            "svd-ensemble and distill-director make ensembles of this model",
        )
    for member, name in zip(members[1:], names[1:], strict=True):
        if member.family.name != first.family.name:
            raise IncompatibleInputError(
                f"members come from different families: {name} is {member.family.name}, "
                f"{names[0]} is {first.family.name}",
                hint="fuse members pruned from one base model",
            )
        for key in first.family.shape_keys:  # what must agree for one residual stream
            if getattr(member.config, key, None) != getattr(first.config, key, None):
                raise IncompatibleInputError(
                    f"members come from different base models: {key} is "
                    f"{getattr(member.config, key, None)} in {name}, "
                    f"{getattr(first.config, key, None)} in {names[0]}",
                    hint="fuse members pruned from one base model",
                )
        if member.labels != first.labels:
            raise IncompatibleInputError(
                f"members have different label sets: {name} has {member.labels}, "
                f"{names[0]} has {first.labels}",
                hint="fuse members trained on the same labels",
            )


def fuse(
    members: list[LoadedModel], shared_layers: int = 0, grouped_kv: bool = True
) -> LoadedModel:
    """The Hydra model of `members` (checked with `check_fusable` and, with a trunk,
    `check_shared_layers` first). With `shared_layers` K the first K blocks are one trunk
    (`trunk_blocks`: every head some member kept, each averaged over the members that keep
    it; norms averaged), run once; the members branch after it.

    With grouped-query attention each member keeps its own key/value heads
    (`HydraSpec.kv_group`); `grouped_kv=False` builds the older layout instead, one K/V copy
    per query slot (what models fused before it hold; benchmarks compare the two).

    Its tokenizer or image preprocessing is the first member's (pruning never changes it).
    """
    from uqcompress.models.surgery import KEPT_HEADS_KEY, KEPT_NEURONS_KEY, kept_heads

    first = members[0]
    parts = [member_parts(m) for m in members]
    spec = HydraSpec(
        members=len(members),
        kept_heads=[kept_heads(m) for m in members],
        shared_layers=shared_layers,
        group=base_group_size(first.config) if grouped_kv else 1,
        member_mlps=own_mlps(members),
    )
    trunk = trunk_blocks(members, spec)
    config = copy.deepcopy(first.config)
    for key in (KEPT_HEADS_KEY, KEPT_NEURONS_KEY):  # the member's own, not the fused model's
        if hasattr(config, key):
            delattr(config, key)
    setattr(config, HYDRA_KEY, spec.to_dict())
    with torch.random.fork_rng(devices=[]):
        hydra = HydraModel(config, first.family)
    reference = parts[0].classifier.weight
    hydra.to(reference.device, reference.dtype)
    with torch.no_grad():
        _average_into(hydra.embeddings, [p.embeddings for p in parts])
        layer: Any
        for index, layer in enumerate(hydra.layers):
            if layer.member_mlps is not None:  # each member's own (narrowed) MLP
                for mlp, p in zip(layer.member_mlps, parts, strict=True):
                    mlp.up.load_state_dict(p.mlp_in[index].state_dict())
                    mlp.down.load_state_dict(p.mlp_out[index].state_dict())
                    if mlp.gate is not None:
                        mlp.gate.load_state_dict(_required(p.mlp_gate[index]).state_dict())
            else:
                _average_into(layer.mlp_in, [p.mlp_in[index] for p in parts])
                _average_into(layer.mlp_out, [p.mlp_out[index] for p in parts])
                if layer.mlp_gate is not None:
                    _average_into(layer.mlp_gate, [_required(p.mlp_gate[index]) for p in parts])
            if index < shared_layers:  # a trunk block: one stream, one set of weights
                _fill_trunk_layer(layer, trunk[index])
                continue
            _stack_norm(layer.norm_attention, [p.norm_attention[index] for p in parts])
            _stack_norm(layer.norm_mlp, [p.norm_mlp[index] for p in parts])
            attention = [p.attention[index] for p in parts]
            _stack_qkv(layer.attention, attention)
            if layer.attention.query_norm is not None:
                _stack_norm(
                    layer.attention.query_norm, [_required(a.query_norm) for a in attention]
                )
                _stack_norm(layer.attention.key_norm, [_required(a.key_norm) for a in attention])
            _stack_output(layer.attention, attention)
            if layer.scale_attention is not None:
                _stack_scale(layer.scale_attention, [p.attention_scale[index] for p in parts])
                _stack_scale(layer.scale_mlp, [p.mlp_scale[index] for p in parts])
        if hydra.final_norm is not None:
            _stack_norm(hydra.final_norm, [_required(p.final_norm) for p in parts])
        if hydra.pooler is not None:
            _stack_heads(hydra.pooler, [_required(p.pooler) for p in parts])
        _stack_heads(hydra.classifier, [p.classifier for p in parts])
    hydra.eval()
    return first.derived(hydra, config)


def shared_weight_members(members: list[LoadedModel], shared_layers: int = 0) -> list[LoadedModel]:
    """Copies of `members` whose embeddings and MLPs are replaced by the member average and
    whose first `shared_layers` blocks are the trunk's (`trunk_blocks`, installed as the
    family's own attention): exactly the function each Hydra member computes. Equal to
    `members` when the members were not fine-tuned separately and there is no trunk."""
    from uqcompress.models.surgery import kept_heads

    spec = HydraSpec(
        members=len(members),
        kept_heads=[kept_heads(m) for m in members],
        shared_layers=shared_layers,
    )
    trunk = trunk_blocks(members, spec)
    copies = [copy.deepcopy(m) for m in members]
    for member in copies:
        for layer, block in enumerate(trunk):
            _install_trunk_block(member, layer, block)
    parts = [member_parts(m) for m in copies]
    with torch.no_grad():
        shared = copy.deepcopy(parts[0].embeddings)
        _average_into(shared, [p.embeddings for p in parts])
        for p in parts:
            p.embeddings.load_state_dict(shared.state_dict())
        # members with MLPs of their own keep them in the fused model
        for index in range(0 if own_mlps(members) else len(parts[0].mlp_in)):
            for name in ("mlp_in", "mlp_out", "mlp_gate"):
                modules = [getattr(p, name)[index] for p in parts]
                if modules[0] is None:  # not a gated MLP
                    continue
                mean = copy.deepcopy(modules[0])
                _average_into(mean, modules)
                for module in modules:
                    module.load_state_dict(mean.state_dict())
    return copies


def mlp_spread(members: list[LoadedModel]) -> float:
    """Largest |difference| between any member's embedding/MLP weight and the average: 0 when
    fusion is exact for the members as given, larger when their fine-tuning moved them apart."""
    parts = [member_parts(m) for m in members]
    worst = 0.0
    for tensors in _shared_tensors(parts, mlps=not own_mlps(members)):
        mean = _mean(tensors)
        worst = max(worst, max(float((t - mean).abs().max()) for t in tensors))
    return worst


def _shared_tensors(parts: list[MemberParts], mlps: bool = True) -> Iterator[list[torch.Tensor]]:
    """The tensors fusion averages: the embeddings, and the MLPs unless members keep their own."""
    modules = [
        [p.embeddings]
        + ([*p.mlp_in, *p.mlp_out, *(g for g in p.mlp_gate if g is not None)] if mlps else [])
        for p in parts
    ]
    for group in zip(*modules, strict=True):
        states = [m.state_dict() for m in group]
        for key, value in states[0].items():
            if value.is_floating_point():
                yield [s[key] for s in states]


@dataclass(frozen=True)
class TrunkBlock:
    """One shared block's weights: its attention over `heads` (original indices, each head's
    Q/K/V rows and output columns averaged over the members that keep it; K/V heads over
    the members that read them) and the members' averaged norms and layer scales."""

    heads: list[int]
    attention: AttentionParts
    norm_attention: nn.Module
    norm_mlp: nn.Module
    attention_scale: torch.Tensor | None
    mlp_scale: torch.Tensor | None


def check_shared_layers(members: list[LoadedModel], shared_layers: int) -> None:
    """One clear line when the first `shared_layers` blocks cannot be one trunk: a count
    outside 0..L-1, or (grouped-query attention) a trunk whose heads read their key/value
    heads unevenly, which the family's own attention cannot hold."""
    from uqcompress.models.surgery import kept_heads

    layers = len(kept_heads(members[0]))
    if shared_layers and own_mlps(members):
        raise IncompatibleInputError(
            f"--shared-layers {shared_layers}: these members keep MLP neurons of their own "
            "(prune --mlp-ratio), so their blocks cannot be one shared trunk",
            hint="fuse them with --shared-layers 0, or prune members without --mlp-ratio",
        )
    if not 0 <= shared_layers < layers:
        raise IncompatibleInputError(
            f"--shared-layers {shared_layers} is not 0..{layers - 1}: the members have "
            f"{layers} blocks and must keep at least one of their own",
            hint=f"pass e.g. --shared-layers {layers // 2}",
        )
    spec = HydraSpec(len(members), [kept_heads(m) for m in members], shared_layers)
    config = members[0].config
    group = base_group_size(config)
    for layer in range(shared_layers):
        heads = spec.trunk_heads(layer)
        if group > 1:
            readers = {h // group: 0 for h in heads}
            for h in heads:
                readers[h // group] += 1
            if len(set(readers.values())) > 1:
                raise IncompatibleInputError(
                    f"block {layer}: the members' heads together ({heads}) read their "
                    "key/value heads unevenly, so they cannot be one shared block",
                    hint="share fewer blocks, or prune members by whole key/value groups "
                    "(uqc prune --unit kv)",
                )


def trunk_blocks(members: list[LoadedModel], spec: HydraSpec) -> list[TrunkBlock]:
    """The first `spec.shared_layers` blocks as one stream, from the members' own weights."""
    from uqcompress.models.surgery import _linear

    group = base_group_size(members[0].config)
    blocks = []
    all_parts = [member_parts(m) for m in members]
    for layer in range(spec.shared_layers):
        heads = spec.trunk_heads(layer)
        kv_heads = sorted({h // group for h in heads})
        attention = [p.attention[layer] for p in all_parts]
        d = attention[0].head_dim

        query, key, value, out_columns = [], [], [], []
        for h in heads:
            having = [m for m, kept in enumerate(spec.kept_heads) if h in kept[layer]]
            slots = [spec.kept_heads[m][layer].index(h) for m in having]
            pairs = list(zip(having, slots, strict=True))
            query.append(_averaged_rows([_head_rows(attention[m].query, j, d) for m, j in pairs]))
            columns = [attention[m].output.weight[:, j * d : (j + 1) * d] for m, j in pairs]
            out_columns.append(_mean(columns))
        for g in kv_heads:
            reading = []
            for m, kept in enumerate(spec.kept_heads):
                own = sorted({h // group for h in kept[layer]})
                if g in own:
                    reading.append((m, own.index(g)))
            key.append(_averaged_rows([_head_rows(attention[m].key, j, d) for m, j in reading]))
            value.append(_averaged_rows([_head_rows(attention[m].value, j, d) for m, j in reading]))

        first = attention[0]
        output = _linear(len(heads) * d, first.output.out_features, first.output.bias is not None)
        with torch.no_grad():
            if heads:
                output.weight.copy_(torch.cat(out_columns, dim=1))
            if first.output.bias is not None:
                output.bias.copy_(_mean([_required(a.output.bias) for a in attention]))
        output = output.to(first.output.weight.device, first.output.weight.dtype)
        query_norm = key_norm = None
        if first.query_norm is not None:
            query_norm = _averaged_module([_required(a.query_norm) for a in attention])
            key_norm = _averaged_module([_required(a.key_norm) for a in attention])
        trunk_attention = AttentionParts(
            query=_linear_of(query, first.query, d),
            key=_linear_of(key, first.key, d),
            value=_linear_of(value, first.value, d),
            output=output,
            head_dim=d,
            query_norm=query_norm,
            key_norm=key_norm,
        )
        scales = [p.attention_scale[layer] for p in all_parts]
        mlp_scales = [p.mlp_scale[layer] for p in all_parts]
        blocks.append(
            TrunkBlock(
                heads=heads,
                attention=trunk_attention,
                norm_attention=_averaged_module([p.norm_attention[layer] for p in all_parts]),
                norm_mlp=_averaged_module([p.norm_mlp[layer] for p in all_parts]),
                attention_scale=(
                    None if scales[0] is None else _mean([_required(t) for t in scales])
                ),
                mlp_scale=(
                    None if mlp_scales[0] is None else _mean([_required(t) for t in mlp_scales])
                ),
            )
        )
    return blocks


Rows = tuple[torch.Tensor, torch.Tensor | None]  # one head's weight rows `[d_h, in]`, bias


def _head_rows(linear: nn.Linear, slot: int, d: int) -> Rows:
    """The weight rows (and bias) of head `slot` of a projection."""
    span = slice(slot * d, (slot + 1) * d)
    return linear.weight[span], (linear.bias[span] if linear.bias is not None else None)


def _averaged_rows(pieces: list[Rows]) -> Rows:
    """One head's rows averaged over the members that have it (bit-equal when they agree)."""
    biases = [b for _, b in pieces]
    bias = None if biases[0] is None else _mean([_required(b) for b in biases])
    return _mean([w for w, _ in pieces]), bias


def _linear_of(pieces: list[Rows], like: nn.Linear, d: int) -> nn.Linear:
    """A projection made of heads' rows, on `like`'s device and dtype.

    Shape: H pieces of `[d, in]` -> weight `[H d, in]`.
    """
    from uqcompress.models.surgery import _linear

    new = _linear(like.in_features, len(pieces) * d, like.bias is not None)
    with torch.no_grad():
        if pieces:
            new.weight.copy_(torch.cat([w for w, _ in pieces]))
            if like.bias is not None:
                new.bias.copy_(torch.cat([_required(b) for _, b in pieces]))
    return new.to(like.weight.device, like.weight.dtype)


def _averaged_module(modules: list[nn.Module]) -> nn.Module:
    """A copy of the first module with the members' average in every floating tensor."""
    mean = copy.deepcopy(modules[0])
    _average_into(mean, modules)
    return mean


def _fill_trunk_layer(layer: Any, block: TrunkBlock) -> None:
    """A one-stream HydraLayer (member axis of 1) set to the trunk block's weights."""
    _stack_norm(layer.norm_attention, [block.norm_attention])
    _stack_norm(layer.norm_mlp, [block.norm_mlp])
    _stack_qkv(layer.attention, [block.attention])
    if layer.attention.query_norm is not None:
        _stack_norm(layer.attention.query_norm, [_required(block.attention.query_norm)])
        _stack_norm(layer.attention.key_norm, [_required(block.attention.key_norm)])
    _stack_output(layer.attention, [block.attention])
    if layer.scale_attention is not None:
        _stack_scale(layer.scale_attention, [block.attention_scale])
        _stack_scale(layer.scale_mlp, [block.mlp_scale])


def _install_trunk_block(member: LoadedModel, layer: int, block: TrunkBlock) -> None:
    """Make `member`'s block `layer` the trunk's, in the family's own modules (the reference
    the fused trunk must reproduce)."""
    family = member.family
    parts = family.block_parts(family.blocks(member.model)[layer], member.config)
    attention = copy.deepcopy(block.attention)
    family.set_attention_layer(member.model, layer, attention, len(block.heads))
    parts = family.block_parts(family.blocks(member.model)[layer], member.config)
    with torch.no_grad():
        parts.norm_attention.load_state_dict(block.norm_attention.state_dict())
        parts.norm_mlp.load_state_dict(block.norm_mlp.state_dict())
        if parts.attention.query_norm is not None and attention.query_norm is not None:
            parts.attention.query_norm.load_state_dict(attention.query_norm.state_dict())
            _required(parts.attention.key_norm).load_state_dict(
                _required(attention.key_norm).state_dict()
            )
        if parts.attention_scale is not None:
            parts.attention_scale.copy_(_required(block.attention_scale))
            _required(parts.mlp_scale).copy_(_required(block.mlp_scale))


def _average_into(target: nn.Module, sources: list[nn.Module]) -> None:
    """Set `target`'s floating-point tensors to the mean of `sources`' (others: the first's).

    Identical tensors are copied, not averaged: (a + a + a) / 3 need not round back to a, and
    members that were never fine-tuned apart must fuse bit-exactly.
    """
    states = [s.state_dict() for s in sources]
    target.load_state_dict({key: _mean([s[key] for s in states]) for key in states[0]})


def _mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0]
    if not first.is_floating_point() or all(torch.equal(first, t) for t in tensors[1:]):
        return first
    return torch.stack(tensors).mean(dim=0)


def _stack_norm(target: Any, norms: list[Any]) -> None:
    """Shape: M norms of `[d]` -> target weight (and bias, LayerNorm) `[M, d]`."""
    target.weight.copy_(torch.stack([n.weight for n in norms]))
    if target.bias is not None:
        target.bias.copy_(torch.stack([n.bias for n in norms]))


def _stack_scale(target: Any, scales: list[torch.Tensor | None]) -> None:
    """Shape: M layer-scale vectors `[d]` -> target weight `[M, d]`."""
    target.weight.copy_(torch.stack([_required(scale) for scale in scales]))


def _stack_heads(target: Any, linears: list[nn.Linear]) -> None:
    """Copy M linears into a GroupedLinear `[M, in, out]`, zero-padding what a member lacks.

    Shape: member m's weight `[out_m, in_m]` lands transposed in `target.weight[m, :in_m,
    :out_m]` and its bias `[out_m]` in `target.bias[m, 0, :out_m]`. For the attention output
    projection `in_m` is the member's kept heads times head_dim (the padded head slots get
    zero rows); the pooler and classifier fill the whole `[in, out]`.
    """
    target.weight.zero_()
    target.bias.zero_()
    for m, linear in enumerate(linears):
        weight = linear.weight.t()  # [in, out]
        rows, cols = weight.shape
        target.weight[m, :rows, :cols] = weight
        if linear.bias is not None:
            target.bias[m, 0, : linear.bias.shape[0]] = linear.bias


def _query_slots(parts: AttentionParts, group: int) -> torch.Tensor:
    """The layer's query slot of each of a member's query heads: head j, reading key/value
    head j // g_m, sits in slot (j // g_m) * group + j % g_m of the grouped layout (group > 1,
    `HydraSpec.kv_group`); in slot j otherwise."""
    heads = torch.arange(parts.heads)
    if group <= 1:
        return heads
    own = max(parts.group_size, 1)
    return (heads // own) * group + heads % own


def _slot_columns(slots: torch.Tensor, d: int) -> torch.Tensor:
    """Shape: head slots `[k]` -> their feature columns `[k d]` (d_h per slot)."""
    return (slots[:, None] * d + torch.arange(d)).reshape(-1)


def _stack_qkv(fused: FusedAttention, attention: list[AttentionParts]) -> None:
    """Shape: per member Q weights `[k_m d_h, d]` and K, V weights `[g_m d_h, d]` -> the
    fused `qkv` weight `[M, d, (S + 2 S_kv) d_h]`, laid out [Q | K | V] with S query and
    S_kv = S / group key/value slots (`fused.split`), zero where a member has no head.

    Grouped (group > 1): Q rows go to their `_query_slots`, a member's key/value head s to
    K/V slot s. Otherwise (group 1), a member with grouped queries gets, in the K/V columns
    of query slot j, a copy of the key/value head that query head j reads (j // g_m)."""
    target, (q_width, kv_width, _) = fused.qkv, fused.split
    group = fused.group
    target.weight.zero_()
    target.bias.zero_()
    for m, parts in enumerate(attention):
        d = parts.head_dim
        q_columns = _slot_columns(_query_slots(parts, group), d)
        kv_rows = torch.arange(parts.kv_heads * d)
        if group > 1:
            kv_columns = kv_rows
        else:  # per query slot: slot j holds key/value head j // g_m
            rows = torch.arange(parts.heads * d)
            own = max(parts.group_size, 1)
            kv_rows = (rows // d // own) * d + rows % d
            kv_columns = rows
        placed = (
            (parts.query, torch.arange(parts.heads * d), q_columns),
            (parts.key, kv_rows, q_width + kv_columns),
            (parts.value, kv_rows, q_width + kv_width + kv_columns),
        )
        for linear, rows_read, columns in placed:
            target.weight[m, :, columns] = linear.weight[rows_read].t()
            if linear.bias is not None:
                target.bias[m, 0, columns] = linear.bias[rows_read]


def _stack_output(fused: FusedAttention, attention: list[AttentionParts]) -> None:
    """The attention output projections into the fused `output` `[M, S d_h, d]`: member
    m's input rows (one d_h block per query head) land in its `_query_slots`, zero elsewhere.

    Shape: member m's weight `[d, k_m d_h]` -> `output.weight[m, slot rows, :]`.
    """
    target, group = fused.output, fused.group
    target.weight.zero_()
    target.bias.zero_()
    for m, parts in enumerate(attention):
        rows = _slot_columns(_query_slots(parts, group), parts.head_dim)
        target.weight[m, rows, :] = parts.output.weight.t()
        if parts.output.bias is not None:
            target.bias[m, 0, :] = parts.output.bias


def _required(module: Any) -> Any:
    assert module is not None, "family layout and Hydra layout disagree"
    return module
