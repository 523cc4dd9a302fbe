"""Differently-pruned ensemble members: score --members, prune --members, eval, finetune."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.methods.pruning import jaccard_per_layer, select_member_heads


@pytest.fixture
def member_scores(cli, tiny_vit_artifact: Path) -> str:  # type: ignore[no-untyped-def]
    return ok(
        cli(
            "score",
            str(tiny_vit_artifact),
            "--method",
            "taylor",
            "--data",
            "builtin:digits@val",
            "--calib-size",
            "8",
            "--members",
            "3",
        )
    )


def test_score_members_writes_one_set_per_member(member_scores: str) -> None:
    artifact = open_artifact(Path(member_scores), expect_kind="scores")
    score = load_file(str(artifact.file("scores.safetensors")))["score"]
    assert tuple(score.shape) == (3, 2, 4)
    assert not torch.equal(score[0], score[1])  # own calibration subsets
    assert artifact.manifest.summary["members"] == 3


def test_prune_members_topk_and_eval_as_an_ensemble(cli, member_scores: str) -> None:  # type: ignore[no-untyped-def]
    members = ok(cli("prune", member_scores, "--members", "3"))
    artifact = open_artifact(Path(members), expect_kind="members")
    summary = artifact.manifest.summary
    assert summary["members"] == 3 and summary["heads_per_member"] == 2  # 1 head x 2 layers
    assert summary["max_logit_diff_vs_gated"] < 1e-5
    expected = jaccard_per_layer(summary["kept_heads"])
    assert summary["jaccard_per_layer"] == pytest.approx(expected, abs=1e-4)  # rounded to 4
    assert sorted(p.name for p in Path(members).iterdir() if p.is_dir()) == [
        "member0",
        "member1",
        "member2",
    ]
    together = json.loads(ok(cli("eval", members, "--data", "builtin:digits@val", "--json")))
    apart = json.loads(
        ok(
            cli(
                "eval",
                *(str(Path(members) / f"member{m}") for m in range(3)),
                "--data",
                "builtin:digits@val",
                "--json",
            )
        )
    )
    assert together["summary"]["members"] == 3
    for key in ("acc", "nll", "ece"):
        assert together["summary"][key] == pytest.approx(apart["summary"][key], abs=1e-9)


def test_finetune_members_trains_each_with_its_own_seed(cli, member_scores: str) -> None:  # type: ignore[no-untyped-def]
    members = ok(cli("prune", member_scores, "--members", "3"))
    tuned = ok(cli("finetune", members, "--data", "builtin:digits@val", "--epochs", "2"))
    summary = open_artifact(Path(tuned), expect_kind="members").manifest.summary
    curves = summary["loss_curves"]
    assert len(curves) == 3 and len(curves[0]) == 2
    assert curves[0] != curves[1]  # seeds differ, so do the runs
    assert ok(cli("eval", tuned, "--data", "builtin:digits@val")).startswith(
        str(Path(tuned).parent)
    )


def test_topk_from_one_score_set_is_refused(cli, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    single = ok(cli("score", str(tiny_vit_artifact), "--method", "l2"))
    result = cli("prune", single, "--members", "3")
    assert result.code == 1 and "would be identical" in result.err
    assert "--members 3" in result.err


def test_partition_members_share_no_head(cli, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    single = ok(cli("score", str(tiny_vit_artifact), "--method", "l2"))
    members = ok(cli("prune", single, "--members", "2", "--select", "partition", "--ratio", "0.5"))
    summary = open_artifact(Path(members)).manifest.summary
    assert summary["jaccard_per_layer"] == [0.0, 0.0]
    first, second = summary["kept_heads"]
    assert all(len(a) == 2 and not set(a) & set(b) for a, b in zip(first, second, strict=True))
    too_many = cli("prune", single, "--members", "3", "--select", "partition", "--ratio", "0.5")
    assert too_many.code == 1 and "at most 1" in too_many.err


def test_multi_set_scores_need_members(cli, member_scores: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("prune", member_scores, "--ratio", "0.5")
    assert result.code == 1 and "--members 3" in result.err


def test_identical_members_are_warned_about(cli, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    sets = ok(cli("score", str(tiny_vit_artifact), "--method", "l2", "--members", "2"))
    members = ok(cli("prune", sets, "--members", "2"))
    manifest = open_artifact(Path(members)).manifest
    assert manifest.summary["jaccard_mean"] == 1.0
    assert any("near-identical" in w for w in manifest.warnings)


def test_gumbel_selection_is_seeded_and_diverse() -> None:
    scores = torch.rand(6, 12, generator=torch.Generator().manual_seed(0))
    a = select_member_heads(scores, 4, 4, "gumbel", seed=1)
    assert a == select_member_heads(scores, 4, 4, "gumbel", seed=1)
    assert a != select_member_heads(scores, 4, 4, "gumbel", seed=2)
    assert all(len(layer) == 4 for member in a for layer in member)
    assert sum(jaccard_per_layer(a)) / 6 < 1.0  # members differ


def test_finetune_members_resumes_the_interrupted_member(
    cli,  # type: ignore[no-untyped-def]
    member_scores: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21: one checkpoint per member; --resume continues the member that was stopped
    and trains the others from the start: the weights of an uninterrupted run."""
    from dataclasses import replace

    from uqcompress.runtime import interrupts
    from uqcompress.steps import finetune
    from uqcompress.steps.common import checkpoint_folder

    members = Path(ok(cli("prune", member_scores, "--members", "3")))
    cfg = finetune.FinetuneConfig(
        data="builtin:digits@val", epochs=2, batch_size=64, checkpoint_every=2
    )
    reference = finetune.run(members, cfg, tmp_path / "ref").artifact
    out = tmp_path / "res"
    calls = {"n": 0}

    def stop() -> None:  # members take 6 steps each; stop member 1 after its 4th
        calls["n"] += 1
        if calls["n"] == 11:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(interrupts, "check", stop)
        with pytest.raises(KeyboardInterrupt):
            finetune.run(members, cfg, out)
    cache = checkpoint_folder(out)
    assert (cache / "member1" / "checkpoint.pt").is_file()
    assert not (cache / "member0").exists()  # member 0 had finished
    resumed = finetune.run(members, replace(cfg, resume=True), out).artifact
    assert not cache.exists()
    for m in range(3):
        a = load_file(str(reference.path / f"member{m}" / "model.safetensors"))
        b = load_file(str(resumed.path / f"member{m}" / "model.safetensors"))
        assert all((a[k] - b[k]).abs().max().item() <= 1e-6 for k in a), m
