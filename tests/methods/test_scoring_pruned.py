"""Scoring a model that was already pruned: head counts come from the model (not from
`config.num_attention_heads`), uneven layers score as `[L, max H_l]` with NaN where a layer
has no head, and selection never picks such a slot."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from uqcompress.errors import ConfigError, IncompatibleInputError, NonFiniteError
from uqcompress.methods.pruning import check_scores_fit, select_heads, select_member_heads
from uqcompress.methods.scoring import (
    absent_slots,
    circuit_evaluations,
    circuit_scores,
    hies_scores,
    l2_scores,
    minmax,
    random_head_scores,
    taylor_scores,
)
from uqcompress.models.head_gates import heads_per_layer
from uqcompress.models.loading import LoadedModel
from uqcompress.models.surgery import prune_heads
from uqcompress.models.tiny import tiny_vit


def _images(count: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(count, 1, 8, 8, generator=gen)
    labels = torch.randint(0, 10, (count,), generator=gen)
    return [{"pixel_values": pixels[i : i + 4], "labels": labels[i : i + 4]} for i in (0, 4)]


def _pruned(keep: list[list[int]]) -> LoadedModel:
    loaded = tiny_vit(seed=2)
    prune_heads(loaded, keep)
    return loaded


UNEVEN = [[0, 2, 3], [1]]  # 3 heads, then 1
EMPTY = [[1, 3], []]  # a layer left with no heads


def test_l2_of_a_pruned_model_is_the_full_models_at_the_kept_heads() -> None:
    full = l2_scores(tiny_vit(seed=2))
    pruned = _pruned(UNEVEN)
    assert int(pruned.config.num_attention_heads) == 4  # the config still says 4
    scores = l2_scores(pruned)
    assert scores.shape == (2, 3)
    assert torch.equal(torch.isnan(scores), absent_slots([3, 1]))
    assert torch.allclose(scores[0], full[0, [0, 2, 3]])
    assert torch.allclose(scores[1, :1], full[1, [1]])


@pytest.mark.parametrize("keep", [[[0, 1], [2, 3]], UNEVEN, EMPTY])
def test_every_scorer_scores_exactly_the_heads_the_model_has(keep: list[list[int]]) -> None:
    loaded = _pruned(keep)
    counts = heads_per_layer(loaded)
    absent = absent_slots(counts)
    width = max(counts)
    batches = _images()
    results = {
        "random": random_head_scores(loaded, 0),
        "l2": l2_scores(loaded),
        "taylor": taylor_scores(loaded, batches, layer_l2=True, global_minmax=True),
        "hies": hies_scores(loaded, batches)["score"],
        "hies-layer": hies_scores(loaded, batches, norm_scope="layer")["score"],
        "circuit": circuit_scores(loaded, batches, [max(1, c - 1) if c else 0 for c in counts])[0],
    }
    for name, scores in results.items():
        assert scores.shape == (len(counts), width), name
        assert torch.equal(torch.isnan(scores), absent), name
        assert bool(torch.isfinite(scores[~absent]).all()), name
        check_scores_fit(scores, counts)  # what prune accepts


def test_circuit_on_uneven_layers_keeps_per_layer_counts() -> None:
    loaded = _pruned(UNEVEN)
    calls: list[tuple[int, int]] = []
    score, kept = circuit_scores(
        loaded, _images(), [2, 1], progress=lambda done, total: calls.append((done, total))
    )
    assert [len(k) for k in kept] == [2, 1]
    assert sorted(score[0].tolist()) == [1.0, 2.0, 3.0]  # a permutation of 1..H_l
    assert score[1, 0] == 1.0 and math.isnan(float(score[1, 1]))
    assert len(calls) == circuit_evaluations([2, 1], [3, 1]) == 3 + 2
    with pytest.raises(ConfigError, match="it has 1"):
        circuit_scores(loaded, _images(), [2, 2])


def test_minmax_ignores_and_keeps_nan_slots() -> None:
    scores = torch.tensor([[1.0, 3.0, math.nan], [2.0, math.nan, math.nan]])
    glob = minmax(scores, "global")
    assert glob[0, 0] == 0.0 and glob[0, 1] == 1.0 and glob[1, 0] == 0.5
    layer = minmax(scores, "layer")
    assert layer[0, 1] == 1.0 and layer[1, 0] == 0.0  # a one-head layer is constant
    assert torch.equal(torch.isnan(glob), torch.isnan(scores))
    assert torch.equal(torch.isnan(layer), torch.isnan(scores))
    empty = minmax(torch.tensor([[1.0, 2.0], [math.nan, math.nan]]), "layer")
    assert bool(torch.isnan(empty[1]).all()) and empty[0].tolist() == [0.0, 1.0]


def test_select_heads_never_keeps_an_absent_slot() -> None:
    nan = math.nan
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.4], [0.8, 0.2, nan, nan], [nan, nan, nan, nan]])
    assert select_heads(scores, 0.5, "layer") == [[0, 2], [0], []]
    # global: round(0.5 * 6) = 3 of the 6 heads go; every layer with heads keeps its best
    assert select_heads(scores, 0.5, "global") == [[0, 2], [0], []]
    assert select_heads(scores, 0.34, "global", min_heads_per_layer=0) == [[0, 2, 3], [0], []]
    with pytest.raises(ConfigError, match="removes 2 of 2 heads in layer 1"):
        select_heads(scores[:2], 0.75, "layer")


def test_check_scores_fit_refuses_a_mismatched_nan_pattern_or_shape() -> None:
    nan = math.nan
    check_scores_fit(torch.tensor([[1.0, 2.0], [3.0, nan]]), [2, 1])
    with pytest.raises(IncompatibleInputError, match="shape"):
        check_scores_fit(torch.rand(2, 4), [2, 2])  # config-sized scores for a pruned model
    with pytest.raises(IncompatibleInputError, match="missing"):
        check_scores_fit(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), [2, 1])
    with pytest.raises(IncompatibleInputError, match="missing"):
        check_scores_fit(torch.tensor([[1.0, nan], [3.0, 4.0]]), [2, 2])
    with pytest.raises(NonFiniteError, match="NaN or infinite for 1 of 2 heads"):
        check_scores_fit(torch.tensor([[1.0, math.inf]]), [2])
    # issue 26 item 19: NaN scores of heads the model has (a model with NaN outputs) are
    # non-finite scores, not "score this model first"
    with pytest.raises(NonFiniteError, match="layer 0 head 0"):
        check_scores_fit(torch.full((2, 2), nan), [2, 2])
    with pytest.raises(NonFiniteError, match="layer 1 head 0"):
        check_scores_fit(torch.tensor([[1.0, 2.0], [nan, 4.0]]), [2, 2])


@pytest.mark.parametrize("select", ["gumbel", "partition"])
def test_gumbel_and_partition_use_the_mean_of_several_score_sets(select: str) -> None:
    """Item 17: given [S, L, H] scores they used set 0 and silently dropped the others."""
    sets = torch.stack(
        [
            torch.tensor([[4.0, 3.0, 2.0, 1.0]]),  # set 0 ranks heads 0, 1, ...
            torch.tensor([[0.0, 0.0, 9.0, 9.0]]),  # set 1 strongly prefers heads 2, 3
        ]
    )
    mean = sets.mean(dim=0)
    got = select_member_heads(sets, 2, 2 if select == "gumbel" else 1, select, seed=0)
    assert got == select_member_heads(mean, 2, 2 if select == "gumbel" else 1, select, seed=0)
    if select == "partition":  # mean ranking 2, 3, 0, 1: dealt 2 -> m0, 3 -> m1
        assert got == [[[2]], [[3]]]
