"""`uqc fuse` end to end: members -> Hydra model -> eval, finetune, ONNX export, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.export import contract


def _members(cli, model: Path, data: str, select: str = "partition") -> str:  # type: ignore[no-untyped-def]
    scores = ok(cli("score", str(model), "--method", "l2", "--data", data, "--calib-size", "8"))
    return ok(cli("prune", scores, "--members", "2", "--select", select))


@pytest.fixture(scope="module")
def vit_members(tmp_path_factory: pytest.TempPathFactory, briefly_trained_vit: Path) -> Path:
    """2 ViT members (partition: no shared head) of a briefly trained tiny ViT, built once."""
    from uqcompress.steps import prune, score

    root = tmp_path_factory.mktemp("hydra-vit")
    scores = score.run(
        briefly_trained_vit,
        score.ScoreConfig(method="l2", data="builtin:digits@val", calib_size=8),
        root / "scores",
    )
    return prune.run(
        scores.artifact.path,
        prune.PruneConfig(members=2, select="partition"),
        out=root / "members",
    ).artifact.path


def test_fuse_writes_a_hydra_model_that_evaluates_like_its_members(cli, vit_members: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("fuse", str(vit_members))
    hydra = ok(result)
    summary = open_artifact(Path(hydra), expect_kind="model").manifest.summary
    assert summary["members"] == 2 and summary["method"] == "hydra"
    assert summary["exact"] is True and summary["fusion_exactness_max_logit_diff"] < 1e-5
    # identical embeddings/MLPs: fusing changed nothing against the members as given
    change = summary["change_vs_members"]
    assert change["examples"] == 12 and change["max_logit_diff"] < 1e-5
    assert change["agreement"] == 1.0
    assert change["mean_mutual_info_fused"] == pytest.approx(
        change["mean_mutual_info_members"], abs=1e-6
    )
    assert "warning" not in result.err
    assert summary["parameters"] < sum(summary["parameters_members"])  # MLP etc. shared
    fused = json.loads(ok(cli("eval", hydra, "--data", "builtin:digits@val", "--json")))
    apart = json.loads(ok(cli("eval", str(vit_members), "--data", "builtin:digits@val", "--json")))
    assert fused["summary"]["members"] == 2
    for key in ("acc", "nll", "ece", "brier", "disagreement"):
        assert fused["summary"][key] == pytest.approx(apart["summary"][key], abs=1e-6)


def test_fused_model_fine_tunes_jointly_and_exports_with_parity(cli, vit_members: Path) -> None:  # type: ignore[no-untyped-def]
    from uqcompress.export.runtime import Predictor

    hydra = ok(cli("fuse", str(vit_members)))
    tuned = ok(cli("finetune", hydra, "--data", "builtin:digits@val", "--epochs", "1"))
    tuned_summary = open_artifact(Path(tuned), expect_kind="model").manifest.summary
    assert tuned_summary["members"] == 2 and len(tuned_summary["loss_curve"]) == 1
    exported = ok(cli("export", tuned, "--data", "builtin:digits@test"))
    artifact = open_artifact(Path(exported), expect_kind="onnx")
    assert artifact.manifest.summary["members"] == 2
    parity = json.loads((Path(exported) / "parity.json").read_text())
    assert parity["passed"] and all(v < 1e-4 for v in parity["max_abs_diff"].values())
    meta = {
        p.key: p.value for p in onnx.load(str(Path(exported) / contract.ONNX_FILE)).metadata_props
    }
    assert meta[contract.META_MEMBERS] == "2"
    assert meta[contract.META_AGGREGATION] == contract.AGGREGATION
    predictor = Predictor(Path(exported))
    images = np.random.default_rng(0).uniform(0, 255, size=(3, 1, 8, 8)).astype(np.float32)
    result = predictor.predict_pixels(images)
    assert result.member_logits.shape == (3, 2, 10)
    member_probs = np.exp(result.member_logits) / np.exp(result.member_logits).sum(
        -1, keepdims=True
    )
    assert np.allclose(result.probs, member_probs.mean(axis=1), atol=1e-5)
    assert (result.mutual_info >= -1e-6).all()


def test_separately_finetuned_members_fuse_with_a_warning(cli, vit_members: Path) -> None:  # type: ignore[no-untyped-def]
    """Members fine-tuned apart: the fusion is still exact against the averaged members, but
    the change against the members as they were is large, reported, and warned about."""
    tuned = ok(
        cli(
            "finetune", str(vit_members), "--data", "builtin:digits@val", "--epochs", "2",
            "--lr", "5e-3",
        )
    )  # fmt: skip
    result = cli("fuse", tuned)
    hydra = ok(result)
    manifest = open_artifact(Path(hydra), expect_kind="model").manifest
    summary = manifest.summary
    assert summary["exact"] is False and summary["shared_weight_spread"] > 0
    assert summary["fusion_exactness_max_logit_diff"] < 1e-4  # vs the averaged members
    change = summary["change_vs_members"]  # vs the members as fine-tuned: measured 0.168
    assert change["max_logit_diff"] > 0.05 > 1e3 * summary["fusion_exactness_max_logit_diff"]
    assert change["agreement"] < 1.0  # measured 11/12
    warnings = [line for line in result.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "max logit difference" in warnings[0]
    assert any("average" in w for w in manifest.warnings)


def test_fuse_artifacts_of_model_kind_version_1_read_with_the_renamed_key(  # type: ignore[no-untyped-def]
    cli, vit_members: Path, tmp_path: Path
) -> None:
    import shutil

    from uqcompress.artifacts import read_manifest

    old = tmp_path / "old-hydra"
    shutil.copytree(ok(cli("fuse", str(vit_members))), old)
    raw = json.loads((old / "manifest.json").read_text())
    raw["kind_version"] = 1  # what uqc wrote before issue 26 item 6
    raw["summary"]["max_logit_diff_vs_members"] = raw["summary"].pop(
        "fusion_exactness_max_logit_diff"
    )
    del raw["summary"]["change_vs_members"]
    (old / "manifest.json").write_text(json.dumps(raw))
    summary = open_artifact(old, expect_kind="model").manifest.summary
    assert read_manifest(old).kind_version == 2
    assert summary["fusion_exactness_max_logit_diff"] < 1e-5
    assert "max_logit_diff_vs_members" not in summary
    assert json.loads(ok(cli("eval", str(old), "--data", "builtin:digits@val", "--json")))


def test_bert_members_fuse_and_export(cli, trained_bert_artifact: Path, sentiment_csv) -> None:  # type: ignore[no-untyped-def]
    members = _members(cli, trained_bert_artifact, str(sentiment_csv["train"]), "gumbel")
    hydra = ok(cli("fuse", members))
    assert open_artifact(Path(hydra), expect_kind="model").manifest.summary["exact"] is True
    exported = ok(cli("export", hydra))
    parity = json.loads((Path(exported) / "parity.json").read_text())
    assert parity["passed"] and parity["padded_batches"] > 0


def test_loose_pruned_models_of_one_base_fuse(cli, vit_members: Path) -> None:  # type: ignore[no-untyped-def]
    from uqcompress.artifacts import read_manifest

    scores_ref = read_manifest(vit_members).inputs[1]
    scores = (vit_members / scores_ref.path).resolve()
    a = ok(cli("prune", str(scores), "--ratio", "0.5"))
    b = ok(cli("prune", str(scores), "--ratio", "0.25"))
    hydra = ok(cli("fuse", a, b))
    summary = open_artifact(Path(hydra), expect_kind="model").manifest.summary
    assert summary["members"] == 2 and summary["padding_ratio"] > 0  # 2 vs 3 heads per layer


def _refused(result, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert result.code == 1, result.err
    assert result.out == ""
    line = result.err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    for word in words:
        assert word in line


def test_fuse_bad_inputs_are_one_line_errors(cli, vit_members: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from uqcompress.artifacts import read_manifest

    scores = (vit_members / read_manifest(vit_members).inputs[1].path).resolve()
    model = (vit_members / read_manifest(vit_members).inputs[0].path).resolve()
    out = tmp_path / "hydra"
    _refused(cli("fuse", str(model), "--out", str(out)), "members artifact")
    _refused(cli("fuse", str(scores), "--out", str(out)), "scores artifact")
    pruned = ok(cli("prune", str(scores), "--ratio", "0.5"))
    _refused(cli("fuse", pruned, "--out", str(out)), "members artifact")  # a single member
    _refused(cli("fuse", str(model), pruned, "--out", str(out)), "was not pruned")
    _refused(cli("fuse", pruned, pruned, "--out", str(out)), "more than once")
    other_base = ok(
        cli("init", "--family", "vit", "--labels", ",".join("0123456789"), "--seed", "7")
    )
    other_scores = ok(cli("score", other_base, "--method", "l2", "--data", "builtin:digits@val"))
    other = ok(cli("prune", other_scores, "--ratio", "0.5"))
    _refused(cli("fuse", pruned, other, "--out", str(out)), "different base models")
    hydra = ok(cli("fuse", str(vit_members)))
    _refused(cli("score", hydra, "--data", "builtin:digits@val", "--out", str(out)), "Hydra")
    assert not out.exists()


def test_fuse_in_bfloat16_builds_and_saves_a_bfloat16_hydra(  # type: ignore[no-untyped-def]
    cli, tiny_llama_artifact: Path, sentiment_csv, tmp_path: Path
) -> None:
    """--dtype bfloat16: the members load and the Hydra model is built, checked and saved in
    bfloat16 (half the memory of float32), its parity within bfloat16 round-off; it predicts
    what the float32 fusion predicts within that round-off; --dtype float32 is the fusion
    without the option (same id)."""
    import torch
    from safetensors import safe_open

    from uqcompress.engine.modality import synthetic_batch
    from uqcompress.models.loading import load_model, resolve_model_source
    from uqcompress.models.precision import HALF_PARITY_ATOL

    members = _members(cli, tiny_llama_artifact, str(sentiment_csv["train"]))
    paths = {
        dtype: Path(ok(cli("fuse", members, "--dtype", dtype, "--out", tmp_path / dtype)))
        for dtype in ("float32", "bfloat16")
    }
    default = Path(ok(cli("fuse", members, "--out", tmp_path / "default")))
    manifests = {k: open_artifact(p).manifest for k, p in {**paths, "default": default}.items()}
    assert manifests["float32"].id == manifests["default"].id  # float32 is left out of the id
    assert manifests["bfloat16"].id != manifests["float32"].id
    half = manifests["bfloat16"].summary
    assert half["dtype"] == "bfloat16" and manifests["float32"].summary["dtype"] == "float32"
    with safe_open(str(paths["bfloat16"] / "model.safetensors"), "pt") as f:
        stored = {f.get_slice(k).get_dtype() for k in list(f.keys())}
    assert stored == {"BF16"}
    parity = json.loads((paths["bfloat16"] / "parity.json").read_text())
    assert parity["passed"] is True and parity["atol"] == HALF_PARITY_ATOL["bfloat16"]
    full = load_model(resolve_model_source(paths["float32"]))
    bf16 = load_model(resolve_model_source(paths["bfloat16"]), "bfloat16")
    assert json.loads((paths["bfloat16"] / "config.json").read_text())["dtype"] == "bfloat16"
    batch = synthetic_batch(full, count=8)
    with torch.inference_mode():
        want = full.model(**batch).member_logits.softmax(-1)
        got = bf16.model(**batch).member_logits.float().softmax(-1)
    assert (got - want).abs().max() < HALF_PARITY_ATOL["bfloat16"]


def test_members_with_their_own_mlp_neurons_fuse_exactly_and_export(  # type: ignore[no-untyped-def]
    cli, tiny_llama_artifact: Path, sentiment_csv, tmp_path: Path
) -> None:
    """prune --mlp-ratio: each member keeps its own MLP in the fused model (not averaged),
    so the Hydra model equals the members as given; ONNX parity as for any Hydra model."""
    data = str(sentiment_csv["train"])
    scores = ok(cli("score", str(tiny_llama_artifact), "--method", "l2", "--data", data))
    narrow = ok(
        cli("prune", scores, "--members", "2", "--select", "partition", "--mlp-ratio", "0.5")
    )
    hydra = ok(cli("fuse", narrow))
    summary = open_artifact(Path(hydra), expect_kind="model").manifest.summary
    assert summary["exact"] is True and summary["change_vs_members"]["max_logit_diff"] < 1e-5
    whole = ok(cli("fuse", ok(cli("prune", scores, "--members", "2", "--select", "partition"))))
    # the MLPs: 2 of half the width against 1 shared of the whole width
    assert summary["parameters"] == open_artifact(Path(whole)).manifest.summary["parameters"]
    config = json.loads((Path(hydra) / "config.json").read_text())
    assert config["uqc_hydra"]["mlp"] == "per_member" and "uqc_kept_neurons" not in config
    fused = json.loads(ok(cli("eval", hydra, "--data", data, "--json")))
    apart = json.loads(ok(cli("eval", narrow, "--data", data, "--json")))
    for key in ("acc", "nll", "ece", "disagreement"):
        assert fused["summary"][key] == pytest.approx(apart["summary"][key], abs=1e-6)
    exported = ok(cli("export", hydra))
    assert json.loads((Path(exported) / "parity.json").read_text())["passed"]
    out = tmp_path / "trunk"
    _refused(cli("fuse", narrow, "--shared-layers", "1", "--out", str(out)), "--mlp-ratio")
    assert not out.exists()
    # a narrowed member beside one with the whole MLP: its MLP would be averaged with
    # neurons it does not have
    from uqcompress.errors import IncompatibleInputError
    from uqcompress.methods.hydra import own_mlps
    from uqcompress.models.loading import load_model, resolve_model_source

    loose = ok(cli("prune", scores, "--ratio", "0.5", "--scope", "layer"))
    mixed = [load_model(resolve_model_source(p)) for p in (Path(narrow) / "member0", Path(loose))]
    with pytest.raises(IncompatibleInputError, match="narrowed MLPs"):
        own_mlps(mixed)
