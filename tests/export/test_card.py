"""export/card.py: the model card every export and quantized model writes, from its artifacts
only; and the tokenizer file an ONNX export ships (truncation and padding set)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from uqcompress.export.card import CARD_FILE, latest_eval


def _front_matter(card: str) -> dict[str, Any]:
    assert card.startswith("---\n")
    head = card.split("---\n")[1]
    parsed = yaml.safe_load(head)
    assert isinstance(parsed, dict)
    return parsed


def _table_value(card: str, label: str) -> float:
    found = re.search(rf"^\| {re.escape(label)} \| ([0-9.]+) \|$", card, re.MULTILINE)
    assert found is not None, label
    return float(found.group(1))


@pytest.fixture(scope="module")
def carded(
    tmp_path_factory: pytest.TempPathFactory,
    trained_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> dict[str, Path]:
    """A calibrated (with abstention) tiny BERT, evaluated with an OOD set, then exported to
    ONNX and safetensors, and int8-quantized: every card a user gets."""
    from uqcompress.steps import calibrate, eval, export, quantize

    root = tmp_path_factory.mktemp("card")
    test = str(sentiment_csv["test"])
    cal = calibrate.run(
        trained_bert_artifact,
        calibrate.CalibrateConfig(data=test, abstain_coverage=0.8),
        root / "calibrated",
    ).artifact.path
    ev = eval.run(
        [cal], eval.EvalConfig(data=test, ood=[str(sentiment_csv["train"])]), root / "eval"
    ).artifact.path
    onnx = export.run(cal, export.ExportConfig(data=test), root / "onnx").artifact.path
    st = export.run(
        cal, export.ExportConfig(format="safetensors"), root / "safetensors"
    ).artifact.path
    q8 = quantize.run(
        onnx,
        quantize.QuantizeConfig(data=test, min_agreement=0.9, max_coverage_delta=1.0),
        root / "int8",
    ).artifact.path
    return {"calibrated": cal, "eval": ev, "onnx": onnx, "safetensors": st, "int8": q8}


def test_onnx_card_holds_the_artifacts_numbers(carded: dict[str, Path]) -> None:
    card = (carded["onnx"] / CARD_FILE).read_text()
    manifest = json.loads((carded["onnx"] / "manifest.json").read_text())
    assert CARD_FILE in manifest["files"]  # sealed with the artifact (hashed)
    meta = _front_matter(card)
    assert meta["library_name"] == "onnx" and meta["pipeline_tag"] == "text-classification"
    assert "uqcompress" in meta["tags"]
    # the eval beside the exported model, named, and its numbers as metrics.json has them
    metrics = json.loads((carded["eval"] / "metrics.json").read_text())
    assert "`eval`" in card
    index = meta["model-index"][0]["results"][0]["metrics"]
    assert {m["type"]: m["value"] for m in index}["accuracy"] == pytest.approx(
        metrics["acc"], abs=1e-6
    )
    assert _table_value(card, "accuracy") == pytest.approx(metrics["acc"], abs=5e-5)
    assert _table_value(card, "ECE (15 bins)") == pytest.approx(metrics["ece"], abs=5e-5)
    ood = re.search(r"^\| train \(`[^`]+`\) \| entropy \| ([0-9.]+) \|", card, re.MULTILINE)
    assert ood is not None
    assert float(ood.group(1)) == pytest.approx(metrics["ood.train.entropy.auroc"], abs=5e-5)
    # calibration: the temperature in the graph, the abstention rule, its coverage and risk
    calibrated = json.loads((carded["calibrated"] / "manifest.json").read_text())["summary"]
    assert f"temperature: {calibrated['temperature']:.4f}" in card
    assert f"coverage {calibrated['abstain_coverage']:.1%}" in card
    assert f"{calibrated['abstain_risk']:.4f}" in card
    # parity and latency as the export measured them, the input contract, the lineage
    summary = manifest["summary"]
    assert f"{summary['parity_examples']} examples" in card
    latency = summary["latency"]
    assert latency["ms_per_example"] > 0 and latency["runs"] >= 3
    assert f"{latency['ms_per_example']:.3f} ms per example" in card
    assert f"truncated to {summary['max_length']} tokens" in card
    assert "| 0 | calibrate |" in card and "| 1 | finetune |" in card and "| 2 | init |" in card
    assert "## Intended use and limits" in card


def test_quantized_card_reports_its_drift(carded: dict[str, Path]) -> None:
    card = (carded["int8"] / CARD_FILE).read_text()
    summary = json.loads((carded["int8"] / "manifest.json").read_text())["summary"]
    assert "dynamic" in _front_matter(card)["tags"]
    assert f"{summary['drift_examples']} gate rows" in card
    assert f"argmax agreement {summary['drift_agreement']:.4f}" in card
    # the lineage goes through the float32 export to the calibrated model
    assert "| 0 | export | onnx |" in card and "| 1 | calibrate |" in card


def test_safetensors_card_says_what_loads_it(carded: dict[str, Path]) -> None:
    card = (carded["safetensors"] / CARD_FILE).read_text()
    assert _front_matter(card)["library_name"] == "transformers"
    assert "loads with: transformers.BertForSequenceClassification" in card
    assert "## Input contract" not in card  # the ONNX contract does not apply


def test_a_card_without_an_eval_says_how_to_get_one(bert_onnx: Path) -> None:
    card = (bert_onnx / CARD_FILE).read_text()
    assert "No `uqc eval` of the exported model was found" in card
    assert "model-index" not in _front_matter(card)
    assert "Not calibrated" in card


def _fake_eval(root: Path, name: str, ids: list[str], stamp: str, acc: float) -> None:
    folder = root / name
    folder.mkdir()
    inputs = [{"role": "model", "path": "../m", "id": i} for i in ids]
    manifest = {"kind": "eval", "id": name, "created_utc": stamp, "inputs": inputs}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "metrics.json").write_text(json.dumps({"acc": acc}))


def test_latest_eval_takes_the_newest_eval_of_exactly_that_model(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    _fake_eval(tmp_path, "old", ["abc"], "2026-01-01T00:00:00+00:00", 0.5)
    _fake_eval(tmp_path, "new", ["abc"], "2026-02-01T00:00:00+00:00", 0.7)
    _fake_eval(tmp_path, "ensemble", ["abc", "def"], "2026-03-01T00:00:00+00:00", 0.9)
    _fake_eval(tmp_path, "other", ["def"], "2026-04-01T00:00:00+00:00", 0.1)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    found = latest_eval(tmp_path / "m", "abc")
    assert found is not None
    assert found[0].name == "new" and found[2] == {"acc": 0.7}
    assert latest_eval(tmp_path / "m", "zzz") is None


def test_tokenizer_file_truncates_for_a_plain_onnxruntime_user(bert_onnx: Path) -> None:
    """tokenizers + ONNX Runtime alone, on a text far longer than the model's positions:
    the shipped tokenizer.json truncates it, and the graph gives the Predictor's answer."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from uqcompress.export.runtime import Predictor

    predictor = Predictor(bert_onnx)
    length = predictor.preprocessing["max_length"]
    tokenizer = Tokenizer.from_file(str(bert_onnx / "tokenizer.json"))
    assert tokenizer.truncation is not None and tokenizer.truncation["max_length"] == length
    assert tokenizer.padding is not None
    texts = ["good " * 900, "bad movie"]
    encoded = tokenizer.encode_batch(texts)
    assert len(encoded[0].ids) == length  # 900 words cut to the model's length
    assert len(encoded[1].ids) == length  # padded to the longest of the batch
    session = ort.InferenceSession(str(bert_onnx / "model.onnx"))
    feed = {
        "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
    }
    names = [i.name for i in session.get_inputs()]
    probs = session.run(["probs"], {k: v for k, v in feed.items() if k in names})[0]
    expected = predictor.predict_texts(texts).probs
    np.testing.assert_allclose(probs, expected, atol=1e-5)
