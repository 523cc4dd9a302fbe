"""Pruning units for grouped-query attention (GQA): which query heads go together so the
pruned attention stays valid.

With GQA, layer l has H_l query heads and G_l key/value heads; query head h reads key/value
head h // g_l (g_l = H_l / G_l), and transformers repeats every key/value head g_l times, so
every kept key/value head must keep the same number of query heads. Heads are therefore
removed in units:

- `query` (`--unit query`): tiers. Tier t of a layer holds the t-th best query head of every
  key/value group (G_l heads); removing tiers keeps every group, each with fewer query heads.
- `kv` (`--unit kv`): a whole key/value group with all of its g_l query heads.

A unit's score is the sum of its heads' scores, and `methods.pruning` selects units exactly as
it selects heads. Without GQA (g_l = 1) every head is its own unit, whatever `--unit` says.
The ratio keeps its meaning, the share of query heads removed; it must remove whole units,
and a ratio that does not is refused with the ratios that do.
"""

from __future__ import annotations

import math

import torch

from uqcompress.errors import ConfigError
from uqcompress.models.head_gates import HeadGroups

UNITS = ("query", "kv")


def layer_units(row: torch.Tensor, groups: HeadGroups, layer: int, unit: str) -> list[list[int]]:
    """The units of one layer, as lists of query heads (current indices).

    Shape: row `[max H]` scores of the layer (NaN past its heads).
    """
    heads, group = groups.heads[layer], groups.group_size(layer)
    if group <= 1:
        return [[h] for h in range(heads)]
    kv = groups.kv_heads[layer]
    members = [list(range(k * group, (k + 1) * group)) for k in range(kv)]
    if unit == "kv":
        return members
    # Tiers: each group's heads ranked by score (ties to the lower index), t-th of each.
    ranked = [sorted(m, key=lambda h: (-float(row[h]), h)) for m in members]
    return [sorted(r[t] for r in ranked) for t in range(group)]


def unit_scores(
    scores: torch.Tensor, groups: HeadGroups, unit: str
) -> tuple[torch.Tensor, list[list[list[int]]]]:
    """Scores of the units and the units themselves.

    Shape: scores `[L, max H]` (NaN where a layer has no head) -> `[L, max U]` (NaN past a
    layer's units), and per layer its units as lists of query heads.
    """
    units = [layer_units(scores[layer], groups, layer, unit) for layer in range(len(groups.heads))]
    width = max((len(u) for u in units), default=0)
    out = torch.full((len(units), width), math.nan, dtype=scores.dtype)
    for layer, layer_unit in enumerate(units):
        for index, members in enumerate(layer_unit):
            out[layer, index] = scores[layer, members].sum()
    return out, units


def expand(keep: list[list[int]], units: list[list[list[int]]]) -> list[list[int]]:
    """Kept units per layer -> the sorted query heads they hold."""
    return [
        sorted(h for u in layer_keep for h in units[layer][u])
        for layer, layer_keep in enumerate(keep)
    ]


def removed_units(ratio: float, groups: HeadGroups, unit: str, scope: str) -> float:
    """The ratio of UNITS to remove for `ratio` of query heads; refuses (one line naming the
    valid ratios) a ratio that would split a unit."""
    layers = range(len(groups.heads))
    sizes = [groups.unit_size(layer, unit) for layer in layers]
    if all(size == 1 for size in sizes):
        return ratio
    if scope == "layer":
        for layer in layers:
            heads, size = groups.heads[layer], sizes[layer]
            remove = round(ratio * heads)
            if heads and remove % size:
                raise ConfigError(
                    f"--ratio {ratio} removes {remove} of {heads} query heads in layer {layer}, "
                    f"which is not a whole number of --unit {unit} units of {size} heads "
                    f"(grouped-query attention: {groups.kv_heads[layer]} key/value heads)",
                    hint=f"use one of --ratio {_valid(heads, size)}, or --unit "
                    f"{'kv' if unit == 'query' else 'query'}",
                )
        return ratio
    if len(set(s for s, h in zip(sizes, groups.heads, strict=True) if h)) > 1:
        raise ConfigError(
            f"--scope global with --unit {unit} needs units of one size in every layer; "
            f"this model's are {sizes}",
            hint="use --scope layer",
        )
    total = sum(groups.heads)
    size = max(sizes)
    remove = round(ratio * total)
    if remove % size:
        raise ConfigError(
            f"--ratio {ratio} removes {remove} of {total} query heads, not a whole number of "
            f"--unit {unit} units of {size} heads (grouped-query attention)",
            hint=f"use one of --ratio {_valid(total, size)}",
        )
    return (remove // size) / (total // size)


def units_floor(min_heads_per_layer: int, groups: HeadGroups, unit: str) -> int:
    """`--min-heads-per-layer` in units (rounded up: at least that many heads stay)."""
    size = max((groups.unit_size(layer, unit) for layer in range(len(groups.heads))), default=1)
    return math.ceil(min_heads_per_layer / size)


def _valid(heads: int, size: int) -> str:
    """The ratios that remove whole units of `size` from `heads` query heads, for a hint."""
    ratios = [round(k * size / heads, 3) for k in range(heads // size)]
    return ", ".join(f"{r:g}" for r in ratios)
