"""`uqc compare`: eval artifacts side by side, in every format, with honest ratios."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import ok
from uqcompress.artifacts import open_artifact


@pytest.fixture(scope="module")
def two_evals(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from uqcompress.steps import eval as eval_step
    from uqcompress.steps import init

    root = tmp_path_factory.mktemp("compare")
    evals = []
    for seed in (0, 1):
        model = init.run(
            init.InitConfig(family="vit", labels=[str(d) for d in range(10)], seed=seed),
            root / f"vit{seed}",
        )
        cfg = eval_step.EvalConfig(data="builtin:digits@val", ood=["builtin:photo-patches"])
        evals.append(eval_step.run([model.artifact.path], cfg, root / f"eval{seed}").artifact.path)
    return evals


def test_compare_tabulates_each_eval_with_latency_ratios(cli, two_evals: list[Path]) -> None:  # type: ignore[no-untyped-def]
    result = cli("compare", *map(str, two_evals), "--baseline", "1", "--names", "first,second")
    path = Path(ok(result))
    assert "uqc compare" in result.err  # the table on stderr
    table = json.loads((path / "comparison.json").read_text())
    assert [r["model"] for r in table["rows"]] == ["first", "second"]
    assert table["baseline"] == "second"
    for record, eval_dir in zip(table["rows"], two_evals, strict=True):
        metrics = json.loads((eval_dir / "metrics.json").read_text())
        for key in ("acc", "nll", "ece", "ood.photo-patches.entropy.auroc", "parameters"):
            assert record[key] == metrics[key]
        assert record["latency_e2e_ms"] == metrics["latency_e2e_ms"] >= metrics["latency_ms"]
    assert "e2e ms/ex" in result.err  # its own column
    second = json.loads((two_evals[1] / "metrics.json").read_text())["latency_ms"]
    first = json.loads((two_evals[0] / "metrics.json").read_text())["latency_ms"]
    assert table["rows"][0]["latency_ratio"] == pytest.approx(first / second)
    assert table["rows"][1]["latency_ratio"] == pytest.approx(1.0)
    with (path / "comparison.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["model"] for r in rows] == ["first", "second"]
    assert float(rows[0]["acc"]) == table["rows"][0]["acc"]
    markdown = (path / "comparison.md").read_text().splitlines()
    assert markdown[0].startswith("| model | acc |") and len(markdown) == 4
    import matplotlib.image

    height, width = matplotlib.image.imread(str(path / "comparison.png")).shape[:2]
    assert width >= 1600 and height >= 600  # a grid of legible panels, not a strip
    assert open_artifact(path, expect_kind="compare").manifest.summary["baseline"] == "second"


def _refused(result, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert result.code == 1, result.err
    assert result.out == ""
    line = result.err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    for word in words:
        assert word in line


def test_compare_bad_inputs(
    cli, two_evals: list[Path], tiny_vit_artifact: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from uqcompress.steps import eval as eval_step

    out = tmp_path / "cmp"
    evals = list(map(str, two_evals))
    _refused(cli("compare", *evals, "--baseline", "2", "--out", str(out)), "--baseline 2")
    _refused(cli("compare", *evals, "--names", "one", "--out", str(out)), "--names has 1")
    _refused(cli("compare", str(tiny_vit_artifact), "--out", str(out)), "model artifact")
    other = eval_step.run(
        [tiny_vit_artifact], eval_step.EvalConfig(data="builtin:digits@test"), tmp_path / "e"
    ).artifact.path
    _refused(cli("compare", evals[0], str(other), "--out", str(out)), "different test data")
    assert not out.exists()
