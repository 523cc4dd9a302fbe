"""`uqc eval`: metrics equal an independent computation; deep ensembles average probabilities."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, log_loss

from uqcompress.artifacts import open_artifact
from uqcompress.errors import IncompatibleInputError
from uqcompress.models.loading import load_model, resolve_model_source
from uqcompress.steps import eval as eval_step
from uqcompress.steps import init


def _reference_probs(model_path: Path, texts: list[str]) -> np.ndarray:
    loaded = load_model(resolve_model_source(model_path))
    assert loaded.tokenizer is not None
    with torch.no_grad():
        batch = loaded.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        probs = torch.softmax(loaded.model(**batch).logits.double(), -1).numpy()
    return probs / probs.sum(axis=1, keepdims=True)


def _csv(path: Path) -> tuple[list[str], np.ndarray]:
    import csv

    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return [r["text"] for r in rows], np.array([0 if r["label"] == "neg" else 1 for r in rows])


def test_metrics_match_an_independent_computation(
    tmp_path: Path, trained_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    result = eval_step.run(
        [trained_bert_artifact],
        eval_step.EvalConfig(data=str(sentiment_csv["test"]), batch_size=7),
        tmp_path / "e",
    )
    metrics = json.loads((result.artifact.path / "metrics.json").read_text())
    texts, labels = _csv(sentiment_csv["test"])
    probs = _reference_probs(trained_bert_artifact, texts)
    assert metrics["acc"] == pytest.approx(accuracy_score(labels, probs.argmax(1)))
    assert metrics["nll"] == pytest.approx(log_loss(labels, probs, labels=[0, 1]), abs=1e-5)
    assert metrics["brier"] == pytest.approx(
        np.mean(np.sum((probs - np.eye(2)[labels]) ** 2, axis=1)), abs=1e-5
    )
    assert metrics["acc"] >= 0.85  # the toy task was learnt
    assert metrics["examples"] == 40 and metrics["members"] == 1
    assert metrics["latency_ms"] > 0 and metrics["parameters"] > 0
    bins = json.loads((result.artifact.path / "reliability.json").read_text())
    assert len(bins["count"]) == 15 and sum(bins["count"]) == 40


def test_several_models_form_a_deep_ensemble(
    tmp_path: Path,
    trained_bert_artifact: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    members = [trained_bert_artifact, tiny_bert_artifact]
    result = eval_step.run(
        members, eval_step.EvalConfig(data=str(sentiment_csv["test"])), tmp_path / "ens"
    )
    summary = result.artifact.manifest.summary
    texts, labels = _csv(sentiment_csv["test"])
    mean = (_reference_probs(members[0], texts) + _reference_probs(members[1], texts)) / 2
    assert summary["members"] == 2
    assert summary["nll"] == pytest.approx(log_loss(labels, mean, labels=[0, 1]), abs=1e-5)
    assert [i.role for i in result.artifact.manifest.inputs] == ["member0", "member1"]


def test_ensemble_members_must_share_labels(
    tmp_path: Path, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    other = init.run(init.InitConfig(family="bert", labels=["pos", "neg"]), tmp_path / "o")
    with pytest.raises(IncompatibleInputError, match="disagree on labels"):
        eval_step.run(
            [tiny_bert_artifact, other.artifact.path],
            eval_step.EvalConfig(data=str(sentiment_csv["test"])),
            tmp_path / "e",
        )
    assert not (tmp_path / "e").exists()


def test_eval_artifact_is_reused_and_records_lineage(
    cli,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],  # type: ignore[no-untyped-def]
) -> None:
    first = cli("eval", str(trained_bert_artifact), "--data", str(sentiment_csv["test"]))
    second = cli(
        "eval",
        str(trained_bert_artifact),
        "--data",
        str(sentiment_csv["test"]),
        "--batch-size",
        "3",
    )
    assert first.code == 0 and second.out == first.out
    manifest = open_artifact(Path(first.out.strip())).manifest
    assert manifest.inputs[0].id == open_artifact(trained_bert_artifact).id
    assert manifest.data[0]["examples"] == 40


def test_eval_id_follows_data_contents_not_spelling(
    cli,
    tmp_path: Path,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    copy = tmp_path / "renamed.csv"
    shutil.copy(sentiment_csv["test"], copy)
    monkeypatch.chdir(sentiment_csv["test"].parent)
    spellings = [str(sentiment_csv["test"]), "test.csv", "./test.csv", str(copy)]
    outs = {cli("eval", str(trained_bert_artifact), "--data", s).out for s in spellings}
    assert len(outs) == 1  # one id, reused
    edited = tmp_path / "edited.csv"
    edited.write_text(copy.read_text().replace("pos", "neg", 1))
    assert cli("eval", str(trained_bert_artifact), "--data", str(edited)).out not in outs


def test_long_texts_are_truncated_and_counted(
    cli,
    tmp_path: Path,
    trained_bert_artifact: Path,  # type: ignore[no-untyped-def]
) -> None:
    from tests.conftest import write_csv

    rows = [("good " * 300, "pos"), ("bad film", "neg"), ("awful " * 200, "neg")]
    data = write_csv(tmp_path / "long.csv", rows)  # the tiny BERT's limit is 128 tokens
    result = cli("eval", str(trained_bert_artifact), "--data", str(data), "--json")
    assert result.code == 0, result.err
    payload = json.loads(result.out)
    assert payload["summary"]["truncated"] == 2
    assert any("2 texts were truncated" in w for w in payload["warnings"])
    short = cli(
        "eval", str(trained_bert_artifact), "--data", str(data), "--max-length", "3", "--json"
    )
    assert json.loads(short.out)["summary"]["truncated"] == 3


def test_eval_reports_macro_f1_mcc_and_per_class_accuracy(
    cli, tiny_bert_artifact: Path, sentiment_csv: dict[str, Path], tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "eval",
        tiny_bert_artifact,
        "--data",
        sentiment_csv["test"],
        "--gate",
        "mcc>=-1,f1_macro>=0",
        "--out",
        tmp_path / "e",
    )
    assert result.code == 0, result.err
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert 0.0 <= metrics["f1_macro"] <= 1.0 and -1.0 <= metrics["mcc"] <= 1.0
    per_class = metrics["per_class_accuracy"]
    assert list(per_class) == ["neg", "pos"]  # the model's labels, in order
    assert all(0.0 <= v <= 1.0 for v in per_class.values())
    # accuracy is the support-weighted mean of the per-class values (20 of each class)
    assert metrics["acc"] == pytest.approx(sum(per_class.values()) / 2, abs=1e-9)
    gate = json.loads((tmp_path / "e" / "manifest.json").read_text())["summary"]["gate"]
    assert gate["passed"] is True
