"""An ensemble's eval reports its uncertainty decomposition without `--ood`: the test-set
means of predictive entropy, aleatoric (expected) entropy and mutual information."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import ok
from uqcompress.artifacts import open_artifact
from uqcompress.models.loading import load_model, resolve_model_source
from uqcompress.steps import eval as eval_step
from uqcompress.uq.quality_gates import UNCERTAINTY_METRICS


def _member_probs(model_paths: list[Path], texts: list[str]) -> np.ndarray:
    """Shape: `[N, M, C]`, each model run by itself in float64."""
    columns = []
    for path in model_paths:
        loaded = load_model(resolve_model_source(path))
        assert loaded.tokenizer is not None
        with torch.no_grad():
            batch = loaded.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
            columns.append(torch.softmax(loaded.model(**batch).logits.double(), -1).numpy())
    return np.stack(columns, axis=1)


def _entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _texts(path: Path) -> list[str]:
    import csv

    with path.open() as handle:
        return [row["text"] for row in csv.DictReader(handle)]


def test_deep_ensemble_reports_entropy_aleatoric_and_mi(
    cli: Callable[..., Any],
    trained_bert_artifact: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    members = [trained_bert_artifact, tiny_bert_artifact]
    result = cli("eval", *map(str, members), "--data", str(sentiment_csv["test"]))
    path = Path(ok(result))
    metrics = json.loads((path / "metrics.json").read_text())
    # An independent computation from each member's own probabilities.
    p = _member_probs(members, _texts(sentiment_csv["test"]))  # [N, 2, 2]
    total = _entropy(p.mean(axis=1))
    aleatoric = _entropy(p).mean(axis=1)
    assert metrics["entropy"] == pytest.approx(total.mean(), abs=1e-6)
    assert metrics["aleatoric"] == pytest.approx(aleatoric.mean(), abs=1e-6)
    assert metrics["mi"] == pytest.approx((total - aleatoric).mean(), abs=1e-6)
    assert metrics["mi"] > 1e-3  # a trained and an untrained model disagree
    assert metrics["entropy"] == pytest.approx(metrics["aleatoric"] + metrics["mi"], abs=1e-9)
    assert open_artifact(path).manifest.summary["mi"] == metrics["mi"]
    for header in ("entropy", "aleatoric", "MI"):  # the eval table on stderr
        assert header in result.err
    gated = cli(
        "eval",
        *map(str, members),
        "--data",
        str(sentiment_csv["test"]),
        "--gate",
        "mi>=0,aleatoric<=1,entropy<=1",
    )
    assert gated.code == 0, gated.err
    verdict = open_artifact(Path(gated.out.strip())).manifest.summary["gate"]
    assert verdict["passed"] is True


@pytest.fixture(scope="module")
def sve_and_single(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Evals of a (noisy, untrained) 3-member SVE of a tiny ViT and of the ViT itself."""
    from uqcompress.methods.sve import build_sve
    from uqcompress.models.factory import create_model
    from uqcompress.models.loading import save_model

    root = tmp_path_factory.mktemp("uncertainty")
    base = create_model("vit", [str(d) for d in range(10)], preset="tiny", seed=0)
    save_model(base, root / "vit")
    # sigma 0.5: members far enough apart for an MI well above round-off.
    save_model(build_sve(base, 3, "default", None, 0.5, 0), root / "sve")
    cfg = eval_step.EvalConfig(data="builtin:digits@val")
    sve = eval_step.run([root / "sve"], cfg, root / "eval-sve").artifact.path
    single = eval_step.run([root / "vit"], cfg, root / "eval-vit").artifact.path
    return sve, single


def test_sve_reports_its_decomposition(sve_and_single: tuple[Path, Path]) -> None:
    metrics = json.loads((sve_and_single[0] / "metrics.json").read_text())
    assert metrics["members"] == 3
    assert 0 < metrics["mi"] <= math.log(3)
    assert 0 <= metrics["aleatoric"] <= metrics["entropy"] <= math.log(10)
    assert metrics["entropy"] == pytest.approx(metrics["aleatoric"] + metrics["mi"], abs=1e-9)


def test_a_single_model_reports_no_decomposition(
    cli: Callable[..., Any], sve_and_single: tuple[Path, Path], _artifacts_root: Path
) -> None:
    """M = 1: aleatoric would equal entropy and MI be 0 by definition; like `disagreement`
    and the OOD `mi` score, these keys are an ensemble's, and a gate on them is refused."""
    metrics = json.loads((sve_and_single[1] / "metrics.json").read_text())
    assert metrics["members"] == 1
    assert not set(UNCERTAINTY_METRICS) & set(metrics)
    model = open_artifact(sve_and_single[1]).manifest.inputs[0]
    source = sve_and_single[1].parent / Path(str(model.path)).name
    refused = cli("eval", str(source), "--data", "builtin:digits@val", "--gate", "mi<=0.1")
    assert refused.code == 1 and refused.out == ""
    assert "unknown metric 'mi'" in refused.err and len(refused.err.strip().splitlines()) == 1


def test_compare_shows_the_decomposition_of_ensembles_only(
    cli: Callable[..., Any], sve_and_single: tuple[Path, Path]
) -> None:
    sve, single = sve_and_single
    result = cli("compare", str(single), str(sve), "--names", "vit,sve")
    path = Path(ok(result))
    table = json.loads((path / "comparison.json").read_text())
    assert set(UNCERTAINTY_METRICS) <= set(table["columns"])
    rows = {r["model"]: r for r in table["rows"]}
    sve_metrics = json.loads((sve / "metrics.json").read_text())
    for key in UNCERTAINTY_METRICS:
        assert rows["sve"][key] == sve_metrics[key]
        assert rows["vit"][key] is None  # one model: not reported, shown as '-'
    assert "aleatoric" in (path / "comparison.md").read_text().splitlines()[0]
    assert "MI" in result.err
    # Two single models compare without the (empty) columns.
    alone = cli("compare", str(single), "--names", "vit")
    columns = json.loads((Path(ok(alone)) / "comparison.json").read_text())["columns"]
    assert not set(UNCERTAINTY_METRICS) & set(columns)
