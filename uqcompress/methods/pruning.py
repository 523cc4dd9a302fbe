"""Which heads to keep, given importance scores: per layer or globally, with a floor per layer.

Pure selection logic on `[L, H]` score tensors; `models/surgery.py` removes the heads. Hydra's
`--members` will call `select_heads` once per member score set (or with sampled scores).

A model pruned before scoring has H_l heads in layer l (uneven after `--scope global`): its
scores are `[L, max H_l]` with NaN in the slots `h >= H_l` (`methods/scoring.py`). NaN means
"no such head": it is never selected, and `check_scores_fit` refuses scores whose NaN pattern
does not match the model's heads.
"""

from __future__ import annotations

import math

import torch

from uqcompress.errors import ConfigError, IncompatibleInputError
from uqcompress.methods.gqa import (
    UNITS,
    expand,
    removed_units,
    unit_scores,
    units_floor,
)
from uqcompress.models.head_gates import HeadGroups

SCOPES = ("layer", "global")


def heads_to_remove(ratio: float, num_layers: int, num_heads: int, scope: str) -> int:
    """How many heads a ratio removes: per layer round(ratio * H) each, or round(ratio * L*H)."""
    if scope == "layer":
        return num_layers * round(ratio * num_heads)
    return round(ratio * num_layers * num_heads)


def check_scores_fit(scores: torch.Tensor, heads: list[int], what: str = "the scores") -> None:
    """Refuse scores that do not describe this model's heads: `[..., L, max H_l]`, NaN exactly
    in the absent slots `h >= H_l`, finite everywhere else.

    Shape: scores `[L, H]` or `[M, L, H]`; heads: the model's current count per layer.
    """
    width = max(heads) if heads else 0
    if scores.dim() not in (2, 3) or tuple(scores.shape[-2:]) != (len(heads), width):
        raise IncompatibleInputError(
            f"scores have shape {list(scores.shape)}; the model has {len(heads)} layers with "
            f"{heads} heads",
            hint="score this model first: uqc score MODEL --data D",
        )
    absent = _absent(heads, width)
    nan = torch.isnan(scores)
    present_nan = nan & ~absent
    # Scores of a model pruned otherwise: values where this model has no head, or fewer heads
    # per layer (each layer's NaN slots a suffix of its row, no layer without a head).
    other_heads = bool((absent & ~nan).any()) or (
        bool(present_nan.any()) and _nan_suffixes(scores) and not bool(nan.all(dim=-1).any())
    )
    if other_heads:
        raise IncompatibleInputError(
            f"the scores' missing (NaN) heads do not match the model's {heads} heads per layer",
            hint="score this model first: uqc score MODEL --data D",
        )
    check_finite_scores(scores, heads, what)


def _absent(heads: list[int], width: int) -> torch.Tensor:
    """The slots `h >= H_l` of each layer. Shape: -> `[L, width]` bool."""
    return torch.arange(width)[None, :] >= torch.tensor(heads, dtype=torch.long)[:, None]


def _nan_suffixes(scores: torch.Tensor) -> bool:
    """Every row's NaN slots are at its end (the absent heads of a pruned layer)."""
    nan = torch.isnan(scores)
    # a NaN followed by a number somewhere in a row: not a suffix
    return not bool((nan[..., :-1] & ~nan[..., 1:]).any())


def check_finite_scores(scores: torch.Tensor, heads: list[int], what: str, note: str = "") -> None:
    """NonFiniteError if a head the model has (slot `h < H_l`) scores NaN or infinity: a
    model whose outputs are not finite gives scores that rank nothing.

    Shape: scores `[L, max H_l]` or `[M, L, max H_l]`; heads: the count per layer.
    """
    from uqcompress.errors import NonFiniteError

    present = ~_absent(heads, scores.shape[-1]).expand_as(scores)
    bad = present & ~torch.isfinite(scores)
    if not bool(bad.any()):
        return
    first = [int(i) for i in bad.nonzero()[0]]
    layer, head = first[-2], first[-1]
    raise NonFiniteError(
        f"{what} are NaN or infinite for {int(bad.sum())} of {int(present.sum())} heads "
        f"(the first: layer {layer} head {head})" + (f"; {note}" if note else ""),
        hint="scores of a model with non-finite outputs rank nothing: check it with uqc eval "
        "MODEL --data D, fix it, then score it again",
    )


def _present(scores: torch.Tensor) -> list[int]:
    """Heads per layer that the (NaN-padded) scores describe. Shape: `[L, H]` -> L counts."""
    return [int(n) for n in (~torch.isnan(scores)).sum(dim=1)]


def select_heads(
    scores: torch.Tensor, ratio: float, scope: str = "layer", min_heads_per_layer: int = 1
) -> list[list[int]]:
    """Per layer, the sorted indices of the heads to keep (highest scores kept).

    Shape: scores `[L, H]` (higher = more important; NaN = no such head) -> L lists.

    With H_l the heads layer l has (its non-NaN scores; H for every layer of an unpruned
    model) and the floor f_l = min(`min_heads_per_layer`, H_l):
    - `layer`: every layer removes round(ratio * H_l) of its heads.
    - `global`: the round(ratio * sum H_l) lowest-scoring heads across all layers go, except
      that each layer keeps its f_l best heads (uneven heads per layer result).
    Ties break towards the lower head index, so selection is deterministic.
    """
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"--ratio {ratio} is outside [0, 1)", hint="pass e.g. --ratio 0.5")
    if scope not in SCOPES:
        raise ConfigError(f"unknown --scope {scope!r}", hint=f"use one of: {', '.join(SCOPES)}")
    num_layers, num_heads = scores.shape
    if not 0 <= min_heads_per_layer <= num_heads:
        raise ConfigError(
            f"--min-heads-per-layer {min_heads_per_layer} is outside 0..{num_heads}",
            hint="pass --min-heads-per-layer 1",
        )
    counts = _present(scores)
    floors = [min(min_heads_per_layer, h) for h in counts]
    total = sum(counts)
    remove = sum(round(ratio * h) for h in counts) if scope == "layer" else round(ratio * total)
    removable = total - sum(floors)
    if scope == "layer":
        for layer, (heads, floor) in enumerate(zip(counts, floors, strict=True)):
            per_layer_remove = round(ratio * heads)
            if heads - per_layer_remove < floor:
                where = "per layer" if len(set(counts)) == 1 else f"in layer {layer}"
                raise ConfigError(
                    f"--ratio {ratio} removes {per_layer_remove} of {heads} heads {where}, "
                    f"leaving fewer than --min-heads-per-layer {min_heads_per_layer}",
                    hint=f"with this floor at most {heads - floor} heads per layer "
                    "can go: lower --ratio or --min-heads-per-layer",
                )
    if remove > removable:
        raise ConfigError(
            f"--ratio {ratio} would remove {remove} of {total} heads, but "
            f"--min-heads-per-layer {min_heads_per_layer} lets at most {removable} go",
            hint="lower --ratio, or --min-heads-per-layer 0 to allow empty layers",
        )
    # Rank by score, ties by (layer, head) order: a stable sort of the negated scores.
    order = _stable_descending(scores)
    if scope == "layer":
        return [
            sorted(h for _, h in order[layer][: heads - round(ratio * heads)])
            for layer, heads in enumerate(counts)
        ]
    kept: list[set[int]] = [
        set(h for _, h in order[layer][: floors[layer]]) for layer in range(num_layers)
    ]
    budget = total - remove - sum(len(k) for k in kept)
    flat = sorted(
        (
            (value, layer, head)
            for layer in range(num_layers)
            for value, head in order[layer]
            if head not in kept[layer]
        ),
        key=lambda item: (-item[0], item[1], item[2]),
    )
    for _, layer, head in flat[:budget]:
        kept[layer].add(head)
    return [sorted(k) for k in kept]


def _stable_descending(scores: torch.Tensor) -> list[list[tuple[float, int]]]:
    """Per layer (value, head) by descending value, ties to the lower head; absent (NaN)
    heads left out."""
    return [
        sorted(
            ((float(v), h) for h, v in enumerate(row) if not math.isnan(float(v))),
            key=lambda item: (-item[0], item[1]),
        )
        for row in scores
    ]


SELECTS = ("topk", "gumbel", "partition")
GUMBEL_TEMPERATURE = 1.0  # on per-layer min-max scores: the best head is at most e times likelier


def member_keep_count(num_heads: int, members: int, ratio: float | None, unit: int = 1) -> int:
    """Heads each member keeps per layer: H - round(ratio * H), or about H / M in whole
    units of `unit` heads (grouped-query attention), at least one unit, so that the M
    members together hold about the base model's head count."""
    if ratio is None:
        return max(1, round(num_heads / members / unit)) * unit
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"--ratio {ratio} is outside [0, 1)", hint="pass e.g. --ratio 0.5")
    return num_heads - round(ratio * num_heads)


def select_member_heads(
    scores: torch.Tensor, members: int, keep: int, select: str, seed: int = 0
) -> list[list[list[int]]]:
    """Kept heads per member and layer, for M differently-pruned ensemble members.

    Shape: scores `[M, L, H]` (one set per member, `topk`) or `[L, H]` (`gumbel`,
    `partition`) -> M lists of L sorted lists of `keep` head indices.

    - `topk`: member m keeps the `keep` best heads of score set m.
    - `gumbel`: Gumbel-top-k sampling from one score set: per layer, logits =
      minmax(scores) / 1.0, plus Gumbel noise seeded by (seed, m); the `keep` largest win.
    - `partition`: per layer the heads ranked by score are dealt round-robin (best to member
      0, next to member 1, ...); each member keeps its `keep` best dealt heads, so members
      share no head.

    `gumbel` and `partition` sample or deal from ONE ranking: given several score sets
    `[S, L, H]` they use their mean over the sets (every set counts; none is dropped).
    """
    if select not in SELECTS:
        raise ConfigError(f"unknown --select {select!r}", hint=f"use one of: {', '.join(SELECTS)}")
    if select == "topk":
        if scores.dim() != 3 or scores.shape[0] != members:
            sets = 1 if scores.dim() == 2 else int(scores.shape[0])
            raise ConfigError(
                f"--select topk needs one score set per member; these scores have {sets} "
                f"for {members} members (the members would be identical)",
                hint=f"score with uqc score ... --members {members}, or use --select gumbel "
                "or --select partition",
            )
        return [_top(scores[m], keep) for m in range(members)]
    # Several sets (uqc score --members S): their mean, so that no set is silently dropped.
    base = scores.mean(dim=0) if scores.dim() == 3 else scores
    num_heads = int(base.shape[1])
    if select == "partition":
        if keep * members > num_heads:
            raise ConfigError(
                f"--select partition deals {num_heads} heads per layer to {members} members: "
                f"each gets at most {num_heads // members}, not {keep}",
                hint="raise --ratio, use fewer --members, or --select gumbel",
            )
        order = [[h for _, h in row] for row in _stable_descending(base)]
        return [[sorted(row[m::members][:keep]) for row in order] for m in range(members)]
    lo = base.min(dim=1, keepdim=True).values
    span = (base.max(dim=1, keepdim=True).values - lo).clamp_min(1e-12)
    logits = (base - lo) / span / GUMBEL_TEMPERATURE
    chosen = []
    for m in range(members):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + m)
        uniform = torch.rand(base.shape, generator=generator).clamp(1e-12, 1 - 1e-12)
        chosen.append(_top(logits - torch.log(-torch.log(uniform)), keep))
    return chosen


def _top(scores: torch.Tensor, keep: int) -> list[list[int]]:
    """Shape: `[L, H]` -> per layer the sorted indices of the `keep` largest (ties: lower index)."""
    return [sorted(h for _, h in row[:keep]) for row in _stable_descending(scores)]


def jaccard_per_layer(members: list[list[list[int]]]) -> list[float]:
    """Mean pairwise Jaccard overlap |A & B| / |A | B| of kept heads, per layer (1 if M = 1)."""
    layers = len(members[0])
    result = []
    for layer in range(layers):
        sets = [set(m[layer]) for m in members]
        pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1 :]]
        values = [len(a & b) / len(a | b) if a | b else 1.0 for a, b in pairs]
        result.append(sum(values) / len(values) if values else 1.0)
    return result


def select_grouped_heads(
    scores: torch.Tensor,
    groups: HeadGroups,
    ratio: float,
    scope: str = "layer",
    min_heads_per_layer: int = 1,
    unit: str = "query",
) -> list[list[int]]:
    """`select_heads` for a model with grouped-query attention: whole units go (see
    `methods/gqa.py`), so every kept key/value head keeps the same number of query heads.
    Without GQA it is `select_heads`.

    Shape: scores `[L, H]` -> L sorted lists of kept query heads.
    """
    if unit not in UNITS:
        raise ConfigError(f"unknown --unit {unit!r}", hint=f"use one of: {', '.join(UNITS)}")
    if not groups.grouped:
        return select_heads(scores, ratio, scope, min_heads_per_layer)
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"--ratio {ratio} is outside [0, 1)", hint="pass e.g. --ratio 0.5")
    unit_ratio = removed_units(ratio, groups, unit, scope)
    values, units = unit_scores(scores, groups, unit)
    floor = units_floor(min_heads_per_layer, groups, unit)
    return expand(select_heads(values, unit_ratio, scope, floor), units)


def select_grouped_member_heads(
    scores: torch.Tensor,
    groups: HeadGroups,
    members: int,
    keep: int,
    select: str,
    seed: int = 0,
    unit: str = "query",
) -> list[list[list[int]]]:
    """`select_member_heads` for grouped-query attention: each member keeps `keep` query
    heads per layer in whole units. Without GQA it is `select_member_heads`.

    Shape: scores `[M, L, H]` or `[L, H]` -> M lists of L sorted lists of kept query heads.
    """
    if unit not in UNITS:
        raise ConfigError(f"unknown --unit {unit!r}", hint=f"use one of: {', '.join(UNITS)}")
    if not groups.grouped:
        return select_member_heads(scores, members, keep, select, seed)
    size = groups.unit_size(0, unit)
    heads = groups.heads[0]
    if keep % size:
        valid = ", ".join(f"{1 - k * size / heads:g}" for k in range(1, heads // size + 1))
        raise ConfigError(
            f"each member would keep {keep} of {heads} query heads per layer, not a whole "
            f"number of --unit {unit} units of {size} heads (grouped-query attention)",
            hint=f"use one of --ratio {valid}",
        )
    sets = [scores[m] for m in range(scores.shape[0])] if scores.dim() == 3 else [scores]
    if select != "topk":
        sets = [torch.stack(sets).mean(dim=0)]  # one ranking, as select_member_heads does
    per_set = [unit_scores(s, groups, unit) for s in sets]
    stacked = torch.stack([values for values, _ in per_set])
    chosen = select_member_heads(
        stacked if select == "topk" else stacked[0], members, keep // size, select, seed
    )
    return [expand(c, per_set[m if select == "topk" else 0][1]) for m, c in enumerate(chosen)]
