"""Every shipped recipe passes the runner's check (real commands, real options, defined
references and variables, known gate metrics), starts with its how-to comment, and the
compare recipe runs end to end (tiny models) with its table and PNG."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.recipe.parse import load_recipe

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.toml"))
SHIPPED = {
    "hydra-vit-digits.toml",
    "sve-vit-digits.toml",
    "director-vit-digits.toml",
    "compare-digits.toml",
    "hydra-bert-csv.toml",
    "hydra-trunk-bert-csv.toml",
    "hydra-taylor-vit-digits.toml",
    "hydra-circ-vit-digits.toml",
    "hies-sweep-vit-digits.toml",
    "sve-finetune-digits.toml",
    "director-research-digits.toml",
    "mc-dropout-vit-digits.toml",
}
# The papers' own protocols, in the quick form each recipe's header gives (tiny ViTs, short
# training, no gate): the wiring and the protocol, not the accuracy.
QUICK = ["vars.preset=tiny", "vars.epochs=1", "gate.acc=>= 0"]


def test_recipes_are_shipped() -> None:
    assert {p.name for p in RECIPES} >= SHIPPED


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_passes_the_check(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), "a recipe starts with a comment: what it does, how to run it"
    assert f"uqc run recipes/{path.name}" in text, "the header says how to run it"
    recipe = load_recipe(path)  # raises RecipeError listing every problem
    assert recipe.gate is not None and recipe.gate.bounds, "every shipped recipe has a gate"
    assert recipe.deprecations == [], "shipped recipes use today's key vocabulary"


def test_compare_recipe_runs_every_method(cli: Callable[..., Any], tmp_path: Path) -> None:
    """compare-digits with tiny ViTs and short training: the wiring, not the accuracy."""
    path = Path(__file__).parents[2] / "recipes" / "compare-digits.toml"
    tiny = ["vars.preset=tiny", "vars.epochs=2"]
    tiny += [f"steps.{s}.epochs=1" for s in ("pruned_tuned", "hydra_tuned", "sve", "director")]
    tiny += [
        "steps.director.samples=2",
        "gate.acc=>= 0",
        "gate.ood.photo-patches.entropy.auroc=>= 0",
    ]
    args = [arg for item in tiny for arg in ("--set", item)]
    result = cli("run", path, "--json", *args)
    assert result.code == 0, result.err[-3000:]
    report = json.loads(result.out)
    compare = Path(report["path"])
    assert report["steps"]["compare"]["kind"] == "compare"
    table = json.loads((compare / "comparison.json").read_text())
    rows = table["rows"] if isinstance(table, dict) else table
    assert len(rows) == 8
    assert (compare / "comparison.png").stat().st_size > 10_000
    assert report["gate"]["passed"] and report["gate"]["step"] == "eval_hydra"
    assert report["gate"]["values"]["params_ratio"] < 1  # Hydra: smaller than one ViT
    calibrated = json.loads(
        (Path(report["steps"]["eval_calibrated"]["path"]) / "metrics.json").read_text()
    )
    assert "temperature" in calibrated and "abstain_risk" in calibrated


def _quick(cli: Callable[..., Any], name: str, *extra: str) -> dict[str, Any]:
    path = Path(__file__).parents[2] / "recipes" / name
    args = [arg for item in [*QUICK, *extra] for arg in ("--set", item)]
    result = cli("run", path, "--json", *args)
    assert result.code == 0, result.err[-3000:]
    report: dict[str, Any] = json.loads(result.out)
    return report


def _summary(report: dict[str, Any], step: str) -> dict[str, Any]:
    manifest = json.loads((Path(report["steps"][step]["path"]) / "manifest.json").read_text())
    summary: dict[str, Any] = manifest["summary"]
    return summary


@pytest.mark.parametrize(
    ("name", "score_step", "method"),
    [
        ("hydra-taylor-vit-digits.toml", "scores", "taylor"),
        ("hydra-circ-vit-digits.toml", "circuit", "headmap"),
    ],
)
def test_hydra_paper_recipes_select_fine_tune_and_fuse_members(
    cli: Callable[..., Any], name: str, score_step: str, method: str
) -> None:
    report = _quick(cli, name, "vars.member_epochs=1")
    kept = []
    for m in range(3):
        scores = _summary(report, f"{score_step}{m}")
        assert scores["method"] == method
        member = _summary(report, f"member{m}")
        # k = H/M: 1 of the tiny ViT's 4 heads in every layer, per MHA block
        assert member["heads_per_layer"] == [1, 1]
        if method == "headmap":  # the searched circuit, kept as searched
            assert scores["evaluations"] == 8 and scores["calibration_set"] == "lowest-loss"
            assert member["kept_heads"] == scores["kept_heads"]
        kept.append(member["kept_heads"])
        assert _summary(report, f"tuned{m}")["epochs"] == 1  # each member fine-tuned alone
    hydra = _summary(report, "hydra")
    assert hydra["members"] == 3
    assert _summary(report, "eval")["members"] == 3
    assert report["gate"]["passed"]


def test_hies_sweep_recipe_prunes_globally_for_every_alpha(cli: Callable[..., Any]) -> None:
    report = _quick(cli, "hies-sweep-vit-digits.toml")
    alphas = {"01": 0.1, "03": 0.3, "05": 0.5, "07": 0.7, "09": 0.9}
    for tag, alpha in alphas.items():
        manifest = json.loads(
            (Path(report["steps"][f"hies{tag}"]["path"]) / "manifest.json").read_text()
        )
        assert manifest["config"]["alpha"] == alpha
        pruned = _summary(report, f"pruned{tag}")
        assert pruned["scope"] == "global" and pruned["heads_after"] == 4
    assert _summary(report, "pruned05_layer")["heads_per_layer"] == [2, 2]
    table = json.loads((Path(report["path"]) / "comparison.json").read_text())
    rows = table["rows"] if isinstance(table, dict) else table
    assert len(rows) == 7
    assert report["gate"]["step"] == "eval05"


def _run_on_headless_bert(
    cli: Callable[..., Any],
    tmp_path: Path,
    sentiment_csv: dict[str, Path],
    recipe: str,
    *extra: str,
) -> Any:
    """`uqc run recipes/<recipe>.toml --json` on a tiny BertModel saved without a classifier
    (what sentence encoders ship), on the sentiment CSVs, one epoch, no gate to meet."""
    from uqcompress.models.factory import create_model

    encoder = create_model("bert", ["a", "b"], seed=3)
    encoder.model.bert.save_pretrained(tmp_path / "encoder")
    assert encoder.tokenizer is not None
    encoder.tokenizer.save_pretrained(tmp_path / "encoder")
    train, test = str(sentiment_csv["train"]), str(sentiment_csv["test"])
    settings = [
        f"vars.model={tmp_path / 'encoder'}",
        f"vars.train={train}",
        f"vars.val={test}",
        f"vars.test={test}",
        "vars.epochs=1",
        "vars.member_epochs=1",
        "vars.max_length=32",
        "gate.acc=>= 0",
        "gate.ece=<= 1",
        *extra,
    ]
    path = Path(__file__).parents[2] / "recipes" / f"{recipe}.toml"
    return cli("run", path, "--json", *(arg for item in settings for arg in ("--set", item)))


def test_hydra_bert_csv_runs_the_taylor_protocol_on_a_headless_bert(
    cli: Callable[..., Any], tmp_path: Path, sentiment_csv: dict[str, Path]
) -> None:
    """The user's BERT recipe, end to end on a tiny BertModel without a classifier (what
    sentence encoders ship): import adds a head, 3 Taylor members of k = H/M heads per layer
    fine-tuned one by one, fused, exported, evaluated."""
    result = _run_on_headless_bert(cli, tmp_path, sentiment_csv, "hydra-bert-csv", "vars.ratio=0.5")
    assert result.code == 0, result.err[-3000:]
    report: dict[str, Any] = json.loads(result.out)
    heads = _summary(report, "imported")["heads"]
    for m in range(3):
        assert _summary(report, f"scores{m}")["method"] == "taylor"
        assert _summary(report, f"member{m}")["heads_per_layer"] == [heads // 2] * 2
    fused = _summary(report, "hydra")
    assert fused["members"] == 3
    onnx = _summary(report, "onnx")
    assert onnx["members"] == 3 and onnx["parity_argmax_agreement"] == 1.0
    metrics = json.loads((Path(report["steps"]["eval"]["path"]) / "metrics.json").read_text())
    assert metrics["members"] == 3 and 0.0 <= metrics["acc"] <= 1.0


def test_hydra_trunk_bert_csv_shares_the_first_blocks_and_ships_int8(
    cli: Callable[..., Any], tmp_path: Path, sentiment_csv: dict[str, Path]
) -> None:
    """The shared-trunk recipe end to end on a tiny headless BERT (2 blocks, so 1 shared):
    HIES, 3 partition members, fused with the first block run once, fine-tuned jointly,
    calibrated, exported, int8 behind the drift gate, evaluated."""
    result = _run_on_headless_bert(
        cli, tmp_path, sentiment_csv, "hydra-trunk-bert-csv", "vars.shared_layers=1"
    )
    assert result.code == 0, result.err[-3000:]
    report: dict[str, Any] = json.loads(result.out)
    assert _summary(report, "scores")["method"] == "hies"
    fused = _summary(report, "fused")
    assert fused["members"] == 3 and fused["shared_layers"] == 1
    onnx = _summary(report, "onnx")
    assert onnx["members"] == 3 and onnx["parity_argmax_agreement"] == 1.0
    assert _summary(report, "int8")["quantization"]["mode"] == "dynamic"
    metrics = json.loads((Path(report["steps"]["eval"]["path"]) / "metrics.json").read_text())
    assert metrics["members"] == 3 and 0.0 <= metrics["acc"] <= 1.0
