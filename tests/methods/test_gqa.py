"""Grouped-query attention: pruning units keep GQA valid, and the pruned decoder equals the
gated full model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ok
from uqcompress.errors import ConfigError
from uqcompress.methods.gqa import unit_scores
from uqcompress.methods.pruning import select_grouped_heads, select_grouped_member_heads
from uqcompress.models.head_gates import HeadGroups

# One layer of 6 query heads over 2 key/value heads (group size 3): heads 0-2 read kv 0.
GROUPS = HeadGroups(heads=[6, 6], kv_heads=[2, 2])
SCORES = torch.tensor([[5.0, 1.0, 3.0, 6.0, 2.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])


def _kv_of(heads: list[int], group: int = 3) -> list[int]:
    return [h // group for h in heads]


def test_query_units_are_tiers_of_every_group() -> None:
    values, units = unit_scores(SCORES, GROUPS, "query")
    # layer 0: group 0 ranks 0 (5), 2 (3), 1 (1); group 1 ranks 3 (6), 5 (4), 4 (2)
    assert units[0] == [[0, 3], [2, 5], [1, 4]]
    assert values[0].tolist() == [11.0, 7.0, 3.0]


def test_unit_query_keeps_every_kv_head_with_equal_query_heads() -> None:
    keep = select_grouped_heads(SCORES, GROUPS, ratio=1 / 3, unit="query")
    assert keep[0] == [0, 2, 3, 5]  # each group loses its worst head
    for layer in keep:
        kv = _kv_of(layer)
        assert sorted(set(kv)) == [0, 1] and kv.count(0) == kv.count(1)


def test_unit_kv_removes_whole_groups() -> None:
    keep = select_grouped_heads(SCORES, GROUPS, ratio=0.5, unit="kv")
    assert keep == [[3, 4, 5], [3, 4, 5]]  # group 1 wins: layer 0 sums 12 > 9, layer 1 15 > 6


def test_a_ratio_that_splits_a_unit_names_the_valid_ratios() -> None:
    with pytest.raises(ConfigError, match="not a whole number of --unit query units") as err:
        select_grouped_heads(SCORES, GROUPS, ratio=0.5, unit="query")  # 3 of 6: 1.5 tiers
    assert "0, 0.333, 0.667" in str(err.value.hint)
    with pytest.raises(ConfigError, match="--unit kv units of 3 heads"):
        select_grouped_heads(SCORES, GROUPS, ratio=1 / 3, unit="kv")


def test_global_scope_removes_the_weakest_tiers_across_layers() -> None:
    keep = select_grouped_heads(SCORES, GROUPS, ratio=1 / 3, scope="global", unit="query")
    # tiers: layer 0 [11, 7, 3], layer 1 [3+6=9, 2+5=7, 1+4=5]: the two weakest (3, 5) go
    assert keep == [[0, 2, 3, 5], [1, 2, 4, 5]]


def test_members_keep_whole_units() -> None:
    members = select_grouped_member_heads(SCORES, GROUPS, 2, keep=2, select="partition")
    assert members[0][0] == [0, 3] and members[1][0] == [2, 5]  # tiers dealt, no shared head
    with pytest.raises(ConfigError, match="not a whole"):
        select_grouped_member_heads(SCORES, GROUPS, 2, keep=3, select="partition")


def test_without_gqa_units_are_heads() -> None:
    plain = HeadGroups(heads=[4], kv_heads=[4])
    keep = select_grouped_heads(torch.tensor([[1.0, 4.0, 2.0, 3.0]]), plain, 0.25, unit="kv")
    assert keep == [[1, 2, 3]]


@pytest.mark.parametrize("unit", ["query", "kv"])
def test_pruning_a_decoder_by_unit_keeps_gqa_and_parity(
    unit: str, tmp_path: Path, cli: Callable[..., Any]
) -> None:
    import json

    model = ok(cli("init", "--family", "qwen2", "--labels", "a,b", "--out", tmp_path / "m"))
    scores = ok(cli("score", model, "--method", "l2", "--out", tmp_path / "s"))
    summary = json.loads((Path(scores) / "manifest.json").read_text())["summary"]
    assert summary["key_value_heads_per_layer"] == [2, 2]
    assert summary["kv_head_of_query"] == [[0, 0, 1, 1], [0, 0, 1, 1]]
    pruned = ok(cli("prune", scores, "--ratio", "0.5", "--unit", unit, "--out", tmp_path / unit))
    info = json.loads((Path(pruned) / "manifest.json").read_text())["summary"]
    assert info["unit"] == unit and info["heads_per_layer"] == [2, 2]
    for layer in info["kept_heads"]:
        kv = _kv_of(layer, group=2)
        if unit == "kv":
            assert len(set(kv)) == 1  # one whole group
        else:
            assert sorted(kv) == [0, 1]  # one query head per group
    assert info["max_logit_diff_vs_gated"] < 1e-5
