"""score -> prune -> score -> prune: a pruned model is scored for the heads it has now (not
`config.num_attention_heads`), for every method, evenly and unevenly pruned; circuit scores
with --members keep each member's searched circuit."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ok
from uqcompress.artifacts import open_artifact

DATA = ("--data", "builtin:digits@val", "--calib-size", "8")


def _score(cli: Any, model: str, method: str, *extra: str) -> tuple[str, torch.Tensor]:
    args = [*DATA] if method in ("taylor", "hies", "headmap", "greedy-circuit", "circuit") else []
    if method in ("headmap", "greedy-circuit", "circuit"):
        args += ["--ratio", "0.5"]
    path = ok(cli("score", model, "--method", method, *args, *extra))
    artifact = open_artifact(Path(path), expect_kind="scores")
    return path, load_file(str(artifact.file("scores.safetensors")))["score"]


def _heads(model: str) -> list[int]:
    return list(open_artifact(Path(model)).manifest.summary["heads_per_layer"])


@pytest.mark.parametrize(
    "method", ["random", "l2", "taylor", "hies", "headmap", "greedy-circuit", "circuit"]
)
def test_score_prune_score_prune_removes_heads_each_time(
    cli: Any, tiny_vit_artifact: Path, method: str
) -> None:
    scores, score = _score(cli, str(tiny_vit_artifact), method)
    assert tuple(score.shape) == (2, 4)
    once = ok(cli("prune", scores, "--ratio", "0.5", "--scope", "layer"))
    assert _heads(once) == [2, 2]

    scores2, score2 = _score(cli, once, method)
    # the pruned model has 2 heads per layer (its config still says num_attention_heads 4)
    assert tuple(score2.shape) == (2, 2), method
    assert bool(torch.isfinite(score2).all())
    summary = open_artifact(Path(scores2)).manifest.summary
    assert summary["heads"] == 2 and summary["heads_per_layer"] == [2, 2]
    twice = ok(cli("prune", scores2, "--ratio", "0.5"))
    pruned = open_artifact(Path(twice)).manifest.summary
    assert pruned["heads_before"] == 4 and pruned["heads_after"] == 2, method
    assert _heads(twice) == [1, 1]
    if method in ("headmap", "greedy-circuit", "circuit"):  # kept as the second search kept
        kept = [[int(h) for h in layer] for layer in summary["kept_heads"]]
        assert [len(k) for k in kept] == [1, 1]


@pytest.mark.parametrize("method", ["random", "l2", "taylor", "hies", "headmap", "greedy-circuit"])
def test_an_unevenly_pruned_model_scores_with_nan_for_absent_heads(
    cli: Any, tiny_vit_artifact: Path, method: str
) -> None:
    first, _ = _score(cli, str(tiny_vit_artifact), "l2")
    # global scope, floor 0: the tiny ViT's l2 scores leave layers with different counts
    uneven = ok(
        cli("prune", first, "--ratio", "0.5", "--scope", "global", "--min-heads-per-layer", "1")
    )
    heads = _heads(uneven)
    assert len(set(heads)) > 1, heads  # the seeded tiny ViT's l2 scores differ per layer
    scores, score = _score(cli, uneven, method)
    assert tuple(score.shape) == (2, max(heads))
    for layer, count in enumerate(heads):
        assert bool(torch.isfinite(score[layer, :count]).all())
        assert bool(torch.isnan(score[layer, count:]).all())
    again = ok(cli("prune", scores, "--ratio", "0.5"))
    after = _heads(again)
    assert sum(after) < sum(heads) and all(a <= h for a, h in zip(after, heads, strict=True))


# --------------------------------------------------------------------------- circuit --members


@pytest.fixture
def circuit_member_scores(cli: Any, tiny_vit_artifact: Path) -> str:
    path, score = _score(cli, str(tiny_vit_artifact), "circuit", "--members", "2")
    assert tuple(score.shape) == (2, 2, 4)
    return path


def test_prune_members_keeps_each_members_searched_circuit(
    cli: Any, circuit_member_scores: str
) -> None:
    searched = open_artifact(Path(circuit_member_scores)).manifest.summary["kept_heads"]
    members = ok(cli("prune", circuit_member_scores, "--members", "2", "--ratio", "0.5"))
    summary = open_artifact(Path(members)).manifest.summary
    assert summary["kept_heads"] == searched
    assert summary["heads_per_member"] == 4  # 2 heads x 2 layers
    for m in range(2):
        config = json.loads((Path(members) / f"member{m}" / "config.json").read_text())
        assert config["uqc_kept_heads"] == searched[m]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--members", "2"], "searched for --ratio 0.5, not no --ratio"),
        (["--members", "2", "--ratio", "0.25"], "searched for --ratio 0.5, not --ratio 0.25"),
        (["--members", "2", "--ratio", "0.5", "--select", "gumbel"], "circuit scores are"),
        (["--members", "2", "--ratio", "0.5", "--select", "partition"], "circuit scores are"),
        (["--members", "3", "--ratio", "0.5"], "hold 2 searched circuit(s), not one for each of 3"),
    ],
)
def test_prune_members_refuses_what_would_ignore_the_circuit(
    cli: Any, circuit_member_scores: str, tmp_path: Path, args: list[str], needle: str
) -> None:
    out = tmp_path / "members"
    result = cli("prune", circuit_member_scores, *args, "--out", out)
    assert result.code == 1
    assert needle in result.err and "(fix: " in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert result.out == "" and not out.exists()


def test_prune_members_refuses_one_circuit_for_several_members(
    cli: Any, tiny_vit_artifact: Path
) -> None:
    single, _ = _score(cli, str(tiny_vit_artifact), "circuit")
    result = cli("prune", single, "--members", "2", "--ratio", "0.5")
    assert result.code == 1
    assert "hold 1 searched circuit(s)" in result.err


# --------------------------------------------------------------------------- --select with sets


def test_gumbel_members_from_score_sets_use_their_mean(cli: Any, tiny_vit_artifact: Path) -> None:
    from uqcompress.methods.pruning import select_member_heads

    scores, score = _score(cli, str(tiny_vit_artifact), "random", "--members", "3")
    assert score.shape[0] == 3
    members = ok(cli("prune", scores, "--members", "2", "--select", "partition"))
    kept = open_artifact(Path(members)).manifest.summary["kept_heads"]
    assert kept == select_member_heads(score.mean(dim=0), 2, 2, "partition")
    assert not math.isnan(float(score.mean()))


# --------------------------------------------------------------------------- bad-input rows


# --------------------------------------------------------------------------- headmap, the alias


def test_headmap_members_keep_their_own_lowest_loss_circuits(
    cli: Any, tiny_vit_artifact: Path
) -> None:
    path, score = _score(
        cli, str(tiny_vit_artifact), "headmap", "--members", "2", "--calib-pool", "32"
    )
    assert tuple(score.shape) == (2, 2, 4)
    summary = open_artifact(Path(path)).manifest.summary
    assert summary["method"] == "headmap" and summary["evaluations"] == 8  # L*H per member
    assert summary["calibration_set"] == "lowest-loss" and summary["calibration_pool"] == 32
    assert summary["calibration_loss_max"] <= summary["pool_loss_mean"] * 2
    for m, kept in enumerate(summary["kept_heads"]):
        # HeadMap keeps, per layer, the heads whose masking raised the loss most
        for layer, heads in enumerate(kept):
            row = score[m, layer]
            assert sorted(heads) == sorted(int(h) for h in row.argsort(descending=True)[:2])
    members = ok(cli("prune", path, "--members", "2", "--ratio", "0.5"))
    assert open_artifact(Path(members)).manifest.summary["kept_heads"] == summary["kept_heads"]


def test_headmap_members_need_a_pool_each(cli: Any, tiny_vit_artifact: Path) -> None:
    result = cli(
        "score", str(tiny_vit_artifact), "--method", "headmap", *DATA, "--ratio", "0.5",
        "--members", "2",
    )  # fmt: skip
    assert result.code == 1 and "--calib-pool" in result.err


def test_circuit_is_the_old_name_of_greedy_circuit(cli: Any, tiny_vit_artifact: Path) -> None:
    old = cli("score", str(tiny_vit_artifact), "--method", "circuit", *DATA, "--ratio", "0.5")
    assert old.code == 0, old.err
    assert "now called greedy-circuit" in old.err
    new = ok(cli("score", str(tiny_vit_artifact), "--method", "greedy-circuit", *DATA,
                 "--ratio", "0.5"))  # fmt: skip
    assert old.out.strip() == new  # the same artifact: the alias is resolved before the id
    assert open_artifact(Path(new)).manifest.summary["method"] == "greedy-circuit"


def test_prune_scope_defaults_to_global_for_one_model_and_layer_for_members(
    cli: Any, tiny_vit_artifact: Path
) -> None:
    scores, score = _score(cli, str(tiny_vit_artifact), "l2")
    default = ok(cli("prune", scores, "--ratio", "0.5"))
    one = open_artifact(Path(default)).manifest
    explicit = ok(cli("prune", scores, "--ratio", "0.5", "--scope", "global"))
    assert one.summary["scope"] == "global" and one.config["scope"] == "global"
    assert default == explicit  # the default is resolved before the id
    from uqcompress.methods.pruning import select_heads

    assert one.summary["kept_heads"] == select_heads(score, 0.5, "global")
    members = open_artifact(Path(ok(cli("prune", scores, "--members", "2", "--select",
                                        "partition")))).manifest  # fmt: skip
    assert members.config["scope"] == "layer"
