"""SVE as fine-tuning from a pretrained backbone (issue 20, item 4): `--heads fresh` gives each
member its own, differently initialised head for the data's classes; a backbone without a
trained head gets that by default. Its export and quantization:
tests/recipe/test_paper_recipes.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.methods.sve import build_sve
from uqcompress.models.factory import create_model
from uqcompress.models.grouped import GroupedLinear

HEAD = "classifier.weight"  # the GroupedLinear of M heads, [M, in, out]


def _head_weight(artifact: Path) -> torch.Tensor:
    """The saved member heads' weights, `[M, in, out]`."""
    weights = load_file(str(artifact / "model.safetensors"))
    return next(v for k, v in weights.items() if k.endswith(HEAD))


def test_fresh_heads_differ_per_member_and_are_drawn_like_a_new_classifier() -> None:
    loaded = create_model("vit", [str(d) for d in range(10)], seed=0)
    copied = build_sve(loaded, 3, "default", None, 0.01, seed=4)
    fresh = build_sve(loaded, 3, "default", None, 0.01, seed=4, fresh_heads=True)
    again = build_sve(loaded, 3, "default", None, 0.01, seed=4, fresh_heads=True)
    other = build_sve(loaded, 3, "default", None, 0.01, seed=5, fresh_heads=True)

    def head(built: object) -> GroupedLinear:
        found = [m for m in built.model.modules() if isinstance(m, GroupedLinear)]  # type: ignore[attr-defined]
        assert len(found) == 1
        return found[0]

    base = loaded.model.classifier.weight.t()  # [in, out]
    assert all(torch.equal(head(copied).weight[m], base) for m in range(3))
    weight = head(fresh).weight  # [M, in, out]
    assert weight.shape == (3, *base.shape)
    assert not torch.equal(weight[0], weight[1]) and not torch.equal(weight[1], weight[2])
    assert not torch.equal(weight[0], base)
    assert torch.count_nonzero(head(fresh).bias) == 0
    std = float(loaded.config.initializer_range)
    assert abs(float(weight.detach().std()) - std) < 0.2 * std  # N(0, initializer_range^2)
    assert torch.equal(weight, head(again).weight)  # seeded
    assert not torch.equal(weight, head(other).weight)
    # everything but the heads is the post-hoc SVE's: same singular values and biases
    state, fresh_state = copied.model.state_dict(), fresh.model.state_dict()
    for name, value in state.items():
        if "classifier" not in name:
            assert torch.equal(value, fresh_state[name]), name


def test_other_label_backbone_is_refused_with_the_fix_then_gets_fresh_heads(
    cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    init = ["init", "--family", "vit", "--labels", "cat,dog,cow"]
    backbone = ok(cli(*init, "--out", tmp_path / "b"))
    args = ["svd-ensemble", backbone, "--data", "builtin:digits@val", "--members", "2"]
    refused = cli(*args, "--epochs", "1", "--out", tmp_path / "no")
    assert refused.code == 1 and refused.out == ""
    assert "outside the model's 3 classes" in refused.err and "--heads fresh" in refused.err
    assert len(refused.err.strip().splitlines()) == 1 and not (tmp_path / "no").exists()
    bad = cli(*args, "--heads", "new", "--out", tmp_path / "no")
    assert bad.code == 1 and "--heads" in bad.err and "auto, copy, fresh" in bad.err

    sve = Path(ok(cli(*args, "--heads", "fresh", "--epochs", "1", "--out", tmp_path / "s")))
    summary = open_artifact(sve).manifest.summary
    assert summary["heads"] == "fresh" and summary["labels"] == [str(d) for d in range(10)]
    assert summary["classifier_replaced"] == "cat,dog,cow"
    assert summary["members"] == 2 and summary["parameters_trainable"] > 0
    config = json.loads((sve / "config.json").read_text())
    assert config["id2label"]["9"] == "9"
    weight = _head_weight(sve)
    assert weight.shape[0] == 2 and weight.shape[-1] == 10
    assert not torch.allclose(weight[0], weight[1])


def test_headless_backbone_gets_fresh_heads_by_default(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loaded = create_model("vit", ["a", "b"], seed=1)
    encoder = tmp_path / "encoder"
    loaded.model.vit.save_pretrained(encoder)  # ViTModel weights only: no classifier
    assert loaded.preprocessing is not None
    loaded.preprocessing.save(encoder)
    imported = ok(cli("import", encoder, "--out", tmp_path / "imp"))
    sve = Path(
        ok(
            cli(
                "svd-ensemble",
                imported,
                "--data",
                "builtin:digits@val",
                "--members",
                "3",
                "--epochs",
                "1",
                "--out",
                tmp_path / "s",
            )
        )
    )
    manifest = open_artifact(sve).manifest
    assert manifest.summary["heads"] == "fresh" and manifest.summary["classifier_initialised"]
    assert manifest.config["heads"] == "auto"
    weight = _head_weight(sve)
    assert weight.shape[:1] == (3,) and weight.shape[-1] == 10
    assert not torch.allclose(weight[0], weight[1]) and not torch.allclose(weight[1], weight[2])
