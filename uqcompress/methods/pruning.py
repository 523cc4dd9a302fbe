"""Which heads to keep, given importance scores: per layer or globally, with a floor per layer.

Pure selection logic on `[L, H]` score tensors; `models/surgery.py` removes the heads. Hydra's
`--members` will call `select_heads` once per member score set (or with sampled scores).
"""

from __future__ import annotations

import torch

from uqcompress.errors import ConfigError

SCOPES = ("layer", "global")


def heads_to_remove(ratio: float, num_layers: int, num_heads: int, scope: str) -> int:
    """How many heads a ratio removes: per layer round(ratio * H) each, or round(ratio * L*H)."""
    if scope == "layer":
        return num_layers * round(ratio * num_heads)
    return round(ratio * num_layers * num_heads)


def select_heads(
    scores: torch.Tensor, ratio: float, scope: str = "layer", min_heads_per_layer: int = 1
) -> list[list[int]]:
    """Per layer, the sorted indices of the heads to keep (highest scores kept).

    Shape: scores `[L, H]` (higher = more important) -> L lists.

    - `layer`: every layer removes round(ratio * H) of its heads.
    - `global`: the round(ratio * L * H) lowest-scoring heads across all layers go, except that
      each layer keeps its `min_heads_per_layer` best heads (uneven heads per layer result).
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
    remove = heads_to_remove(ratio, num_layers, num_heads, scope)
    removable = num_layers * (num_heads - min_heads_per_layer)
    per_layer_remove = round(ratio * num_heads)
    if scope == "layer" and num_heads - per_layer_remove < min_heads_per_layer:
        raise ConfigError(
            f"--ratio {ratio} removes {per_layer_remove} of {num_heads} heads per layer, "
            f"leaving fewer than --min-heads-per-layer {min_heads_per_layer}",
            hint=f"with this floor at most {num_heads - min_heads_per_layer} heads per layer "
            "can go: lower --ratio or --min-heads-per-layer",
        )
    if remove > removable:
        raise ConfigError(
            f"--ratio {ratio} would remove {remove} of {num_layers * num_heads} heads, but "
            f"--min-heads-per-layer {min_heads_per_layer} lets at most {removable} go",
            hint="lower --ratio, or --min-heads-per-layer 0 to allow empty layers",
        )
    # Rank by score, ties by (layer, head) order: a stable sort of the negated scores.
    order = _stable_descending(scores)
    if scope == "layer":
        keep_count = num_heads - per_layer_remove
        return [sorted(h for _, h in order[layer][:keep_count]) for layer in range(num_layers)]
    kept: list[set[int]] = [
        set(h for _, h in order[layer][:min_heads_per_layer]) for layer in range(num_layers)
    ]
    budget = num_layers * num_heads - remove - sum(len(k) for k in kept)
    flat = sorted(
        (
            (float(scores[layer, head]), layer, head)
            for layer in range(num_layers)
            for head in range(num_heads)
            if head not in kept[layer]
        ),
        key=lambda item: (-item[0], item[1], item[2]),
    )
    for _, layer, head in flat[:budget]:
        kept[layer].add(head)
    return [sorted(k) for k in kept]


def _stable_descending(scores: torch.Tensor) -> list[list[tuple[float, int]]]:
    return [
        sorted(((float(v), h) for h, v in enumerate(row)), key=lambda item: (-item[0], item[1]))
        for row in scores
    ]
