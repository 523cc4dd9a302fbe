"""Member-local MLP width: which intermediate neurons each ensemble member keeps.

A Hydra member's residual stream runs the whole MLP, so at M members the MLPs cost M x one
model's. With `uqc prune --members M --mlp-ratio r` member m keeps only r of each layer's
intermediate neurons, and the fused MLPs cost r x M of one. The neurons of a layer are
ranked by weight magnitude (`neuron_order`: the L2 baseline of the head scores, no data
needed) and dealt round-robin into M parts; member m takes its own part, then the previous
member's, and so on, until it holds round(r x I) (`member_neurons`). At r = 1/M the members
share no neuron; at r = 1 every member keeps every neuron (no change).

Measured on the real-data benchmark before this was built (`benchmarks/hydra_mlp_width.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from uqcompress.errors import ConfigError


def neuron_order(up: Any, down: Any, gate: Any | None = None) -> list[int]:
    """One layer's intermediate neurons, largest weight magnitude first (ties: lower index):
    ||up row|| x ||down column|| (x ||gate row|| for a gated MLP).

    Shape: up (and gate) weight `[I, d]`, down weight `[d, I]` -> I indices.
    """
    with torch.no_grad():
        magnitude = up.weight.float().norm(dim=1) * down.weight.float().norm(dim=0)
        if gate is not None:
            magnitude = magnitude * gate.weight.float().norm(dim=1)
    return [int(i) for i in torch.argsort(-magnitude, stable=True)]


def kept_count(inner: int, share: float) -> int:
    """Neurons a member keeps of `inner` at `share` (at least one)."""
    if not 0.0 < share <= 1.0:
        raise ConfigError(
            f"--mlp-ratio {share} is outside (0, 1]", hint="pass e.g. --mlp-ratio 0.5"
        )
    return max(1, round(share * inner))


def member_neurons(order: list[int], members: int, member: int, share: float) -> list[int]:
    """The sorted neurons member `member` of `members` keeps of one layer, given the layer's
    ranking `order` (`neuron_order`): its own dealt part first, then the previous member's,
    each by rank, until it holds `kept_count(len(order), share)`.

    At share 1/M: its own part (no neuron shared); 2/3 of 3: every part but the next
    member's; 1/2 of 3: its own part and the better half of the previous member's.
    """
    parts = [order[p::members] for p in range(members)]
    preference = [i for step in range(members) for i in parts[(member - step) % members]]
    return sorted(preference[: kept_count(len(order), share)])


def member_mlp_neurons(base: Any, members: int, share: float) -> list[list[list[int]]]:
    """Per member and layer, the neurons each of `members` keeps at `share`, ranked on
    `base`'s MLPs (`neuron_order`, `member_neurons`).

    Shape: -> M lists of L sorted lists of `kept_count(I, share)` neuron indices.
    """
    orders = [neuron_order(m.up, m.down, m.gate) for m in base.family.mlp_layers(base.model)]
    return [[member_neurons(order, members, m, share) for order in orders] for m in range(members)]
