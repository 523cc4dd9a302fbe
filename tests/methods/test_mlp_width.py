"""methods/mlp_width.py: which MLP neurons each member keeps at `prune --mlp-ratio`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from uqcompress.errors import ConfigError
from uqcompress.methods.mlp_width import kept_count, member_neurons, neuron_order


def test_a_third_each_deals_every_neuron_to_exactly_one_member() -> None:
    order = [5, 0, 7, 2, 9, 1, 3, 8, 4, 6, 11, 10]
    kept = [set(member_neurons(order, 3, m, 1 / 3)) for m in range(3)]
    assert [len(k) for k in kept] == [4, 4, 4]
    assert set().union(*kept) == set(order) and not (kept[0] & kept[1] | kept[1] & kept[2])
    assert kept[0] == {5, 2, 3, 6}  # ranks 0, 3, 6, 9: the best neuron goes to member 0


def test_larger_shares_add_the_previous_members_parts_by_rank() -> None:
    order = list(range(12))
    kept = [set(member_neurons(order, 3, m, 2 / 3)) for m in range(3)]
    assert [len(k) for k in kept] == [8, 8, 8]
    assert all(len(a & b) == 4 for i, a in enumerate(kept) for b in kept[i + 1 :])
    assert kept[0] == set(range(12)) - set(range(1, 12, 3))  # all but member 1's part
    # a half: its own part, then the better half of member 2's part (ranks 2 and 5)
    assert set(member_neurons(order, 3, 0, 1 / 2)) == {0, 3, 6, 9, 2, 5}
    assert member_neurons(order, 3, 2, 1.0) == order
    assert member_neurons(order, 2, 1, 0.5) == [1, 3, 5, 7, 9, 11]


def test_neurons_are_ranked_by_the_product_of_their_weight_norms() -> None:
    up, down, gate = nn.Linear(2, 3), nn.Linear(3, 2), nn.Linear(2, 3)
    with torch.no_grad():
        up.weight.copy_(torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0]]))
        down.weight.copy_(torch.tensor([[1.0, 1.0, 4.0], [0.0, 0.0, 0.0]]))
        gate.weight.copy_(torch.tensor([[9.0, 0.0], [1.0, 0.0], [1.0, 0.0]]))
    assert neuron_order(up, down) == [2, 1, 0]  # 8, 3, 1
    assert neuron_order(up, down, gate) == [0, 2, 1]  # 9, 8, 3
    assert neuron_order(_ones(2, 3), _ones(3, 2)) == [0, 1, 2]  # ties: the lower index first


def _ones(inputs: int, outputs: int) -> nn.Linear:
    linear = nn.Linear(inputs, outputs)
    with torch.no_grad():
        linear.weight.fill_(1.0)
    return linear


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_shares_outside_zero_to_one_are_refused(share: float) -> None:
    with pytest.raises(ConfigError, match="--mlp-ratio"):
        kept_count(64, share)
    assert kept_count(64, 0.001) == 1  # at least one neuron
