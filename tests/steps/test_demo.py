"""End to end: the demo in quick mode, and `inspect` walking the lineage back to the root."""

from __future__ import annotations

import json
from pathlib import Path

from uqcompress.artifacts import open_artifact


def test_quick_demo_runs_every_step(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("demo", "--quick", "--out", str(tmp_path / "demo"))
    assert result.code == 0, result.err
    onnx = open_artifact(Path(result.out.strip()), expect_kind="onnx")
    assert onnx.manifest.summary["parity_max_abs_probs"] <= 1e-4
    assert "builtin:digits@test" in result.err  # the table title
    rows = {
        name: open_artifact(tmp_path / "demo" / name).manifest.summary
        for name in (
            "eval-single",
            "eval-onnx",
            "eval-pruned",
            "eval-pruned-finetuned",
            "eval-ensemble",
            "eval-hydra",
            "eval-hydra-onnx",
            "eval-hydra-int8",
            "eval-sve",
            "eval-director",
            "eval-mc-dropout",
        )
    }
    assert all(r["examples"] == 360 for r in rows.values())
    assert rows["eval-ensemble"]["members"] == 3
    assert "ood.photo-patches.mi.auroc" in rows["eval-ensemble"]
    # The ONNX export scores the test set like its torch source.
    for key in ("acc", "nll", "ece", "ood.photo-patches.entropy.auroc"):
        assert abs(rows["eval-single"][key] - rows["eval-onnx"][key]) < 1e-5, key
        assert abs(rows["eval-hydra"][key] - rows["eval-hydra-onnx"][key]) < 1e-5, key
    assert rows["eval-hydra"]["members"] == rows["eval-hydra-onnx"]["members"] == 3
    # The int8 Hydra passed its drift gate against the float32 Hydra export, and scores alike.
    int8 = open_artifact(tmp_path / "demo" / "onnx-hydra-int8", expect_kind="onnx")
    assert int8.manifest.summary["quantization"]["mode"] == "dynamic"
    assert rows["eval-hydra-int8"]["members"] == 3
    assert abs(rows["eval-hydra-int8"]["ece"] - rows["eval-hydra-onnx"]["ece"]) <= 0.01
    assert "disagreement" in rows["eval-hydra"]
    assert rows["eval-sve"]["members"] == 4
    assert rows["eval-director"]["members"] == 2
    assert rows["eval-mc-dropout"]["members"] == 2 and "disagreement" in rows["eval-mc-dropout"]
    table = json.loads((tmp_path / "demo" / "compare" / "comparison.json").read_text())
    assert len(table["rows"]) == len(rows) and table["rows"][0]["latency_ratio"] == 1.0
    lineage = json.loads(cli("inspect", str(tmp_path / "demo" / "eval-onnx"), "--json").out)
    assert [(n["kind"], n["step"]) for n in lineage["lineage"]] == [
        ("eval", "eval"),
        ("onnx", "export"),
        ("model", "finetune"),
        ("model", "init"),
    ]
    assert all(n["status"] == "ok" for n in lineage["lineage"])
    again = cli("demo", "--quick", "--out", str(tmp_path / "demo"))
    assert again.out == result.out and again.err.count("reusing") == 30
    pruned = open_artifact(tmp_path / "demo" / "model-pruned").manifest.summary
    assert pruned["heads_after"] == pruned["heads_before"] // 2
    owned = json.loads((tmp_path / "demo" / ".uqc-demo.json").read_text())["owned"]
    assert owned["model-seed0"] == open_artifact(tmp_path / "demo" / "model-seed0").id

    # A user's artifact at one of the demo's paths is never replaced without --force.
    import shutil

    shutil.rmtree(tmp_path / "demo" / "model-sve")
    theirs = cli("init", "--family", "bert", "--labels", "a,b", "--out", tmp_path / "demo" / "x")
    assert theirs.code == 0, theirs.err
    (tmp_path / "demo" / "x").rename(tmp_path / "demo" / "model-sve")
    refused = cli("demo", "--quick", "--out", str(tmp_path / "demo"))
    assert refused.code == 1 and refused.out == ""
    assert refused.err.strip().splitlines() == [refused.err.strip()]
    assert "holds model-sve, an artifact uqc demo did not write there" in refused.err
    assert open_artifact(tmp_path / "demo" / "model-sve").manifest.step == "init"
    assert rows["eval-pruned"]["parameters"] < rows["eval-single"]["parameters"]


def test_inspect_table_and_lineage_on_stderr(cli, trained_bert_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("inspect", str(trained_bert_artifact))
    assert result.code == 0
    assert result.out.strip() == str(trained_bert_artifact)
    assert "lineage" in result.err and "model/init" in result.err
    assert "loss_curve" in result.err
    assert "fingerprint" in result.err


def test_inspect_marks_a_moved_parent_as_missing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    parent = Path(
        cli(
            "init", "--family", "vit", "--num-labels", "10", "--out", str(tmp_path / "p")
        ).out.strip()
    )
    child = cli(
        "finetune",
        str(parent),
        "--data",
        "builtin:digits@val",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "c"),
    ).out.strip()
    parent.rename(tmp_path / "moved")
    lineage = json.loads(cli("inspect", child, "--json").out)["lineage"]
    assert lineage[1]["status"] == "missing"
