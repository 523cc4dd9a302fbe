"""Text pairs (`--text-pair-column`): the tokenizer's pair input with token types where the
family has them, in training, eval, export (parity through the Predictor) and predict; a model
trained on pairs refuses single texts, and the reverse."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import FILLER, ok, sentiment_rows

PAIR_FLAGS = ("--text-column", "premise", "--text-pair-column", "hypothesis")


def _pair_csv(path: Path, n: int, seed: int) -> Path:
    """The label is the sentiment of the second text; the first is filler words."""
    import random

    rng = random.Random(seed)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["premise", "hypothesis", "label"])
        for text, label in sentiment_rows(n, seed):
            writer.writerow([" ".join(rng.sample(FILLER, rng.randint(1, 6))), text, label])
    return path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairs")
    return {
        "train": _pair_csv(root / "train.csv", 48, 3),
        "test": _pair_csv(root / "test.csv", 12, 4),
    }


def _load(path: Path) -> Any:
    from uqcompress.models.loading import load_model, resolve_model_source

    return load_model(resolve_model_source(path))


def test_pairs_are_encoded_with_token_types_only_where_the_family_has_them(
    tiny_bert_artifact: Path, pairs: dict[str, Path], tmp_path: Path
) -> None:
    from uqcompress.data import load_data
    from uqcompress.data.encoding import collate, encode
    from uqcompress.steps import init

    data = load_data(str(pairs["test"]), "premise", text_pair_column="hypothesis")
    assert data.texts is not None and data.text_pairs is not None
    bert = _load(tiny_bert_artifact)
    encoded = encode(data, bert, np.zeros(len(data), dtype=np.int64))
    want = bert.tokenizer(data.texts, data.text_pairs)
    assert encoded.input_ids == want["input_ids"]
    assert encoded.token_type_ids == want["token_type_ids"]
    sep = bert.tokenizer.sep_token_id
    for ids, types in zip(encoded.input_ids, encoded.token_type_ids or [], strict=True):
        first_sep = ids.index(sep)  # [CLS] premise [SEP] -> 0; hypothesis [SEP] -> 1
        assert set(types[: first_sep + 1]) == {0} and set(types[first_sep + 1 :]) == {1}
    batch = collate(encoded, [0, 1, 2])
    width = batch["input_ids"].shape[1]
    for row, i in enumerate([0, 1, 2]):
        n = len(encoded.input_ids[i])
        assert batch["token_type_ids"][row, :n].tolist() == encoded.token_type_ids[i]  # type: ignore[index]
        assert batch["token_type_ids"][row, n:width].tolist() == [0] * (width - n)  # padding
    # RoBERTa has one token type: the pair template, but every type id 0
    roberta_path = init.run(
        init.InitConfig(family="roberta", labels=["neg", "pos"]), tmp_path / "roberta"
    ).artifact.path
    roberta = _load(roberta_path)
    assert int(roberta.config.type_vocab_size) == 1
    plain = encode(data, roberta, np.zeros(len(data), dtype=np.int64))
    assert plain.token_type_ids is None
    assert plain.input_ids == roberta.tokenizer(data.texts, data.text_pairs)["input_ids"]
    assert not collate(plain, [0, 1])["token_type_ids"].any()


def test_pair_model_through_finetune_eval_export_and_predict(
    cli: Callable[..., Any], tiny_bert_artifact: Path, pairs: dict[str, Path], tmp_path: Path
) -> None:
    train, test = str(pairs["train"]), str(pairs["test"])
    model = ok(
        cli(
            "finetune", tiny_bert_artifact, "--data", train, "--val", test, *PAIR_FLAGS,
            "--epochs", "2", "--lr", "3e-3", "--batch-size", "16", "--out", tmp_path / "ft",
        )
    )  # fmt: skip
    config = json.loads((Path(model) / "config.json").read_text())
    assert config["uqc_text_input"] == {"pair": True, "columns": ["premise", "hypothesis"]}
    ok(cli("eval", model, "--data", test, *PAIR_FLAGS))

    # the same data as single texts: one line naming the columns to pass
    single = cli("eval", model, "--data", test, "--text-column", "premise")
    assert single.code == 1 and single.out == ""
    assert "was fine-tuned on text pairs (premise, hypothesis)" in single.err
    assert "--text-column premise --text-pair-column hypothesis" in single.err
    # validation data must be read as the training data are
    mixed = cli("finetune", model, "--data", train, "--val", test, *PAIR_FLAGS[:2], "--epochs", "1")
    assert mixed.code == 0, mixed.err  # single texts now: a warning, not an error
    manifest = json.loads((Path(mixed.out.strip()) / "manifest.json").read_text())
    assert any("trained on text pairs before" in w for w in manifest["warnings"])
    refused = cli("eval", mixed.out.strip(), "--data", test, *PAIR_FLAGS)
    assert refused.code == 1 and "was fine-tuned on single texts" in refused.err

    # export: the parity gate runs the pairs through torch and the Predictor (token types)
    exported = ok(cli("export", model, "--format", "onnx", "--data", test, *PAIR_FLAGS))
    parity = json.loads((Path(exported) / "parity.json").read_text())
    assert parity["passed"] and parity["examples"] == 12 + 12  # the data + synthetic pairs
    from uqcompress.export.runtime import Predictor

    predictor = Predictor(exported)
    assert predictor.text_pair is True and predictor.preprocessing["token_types"] is True
    inputs = predictor.encode_texts(["the movie"], ["great fun"])
    assert inputs["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1]]
    with pytest.raises(Exception, match="fine-tuned on text pairs; no pair texts were given"):
        predictor.predict_texts(["the movie"])

    onnx_run = cli("predict", exported, "--data", test, *PAIR_FLAGS)
    torch_run = cli("predict", model, "--data", test, *PAIR_FLAGS, "--batch-size", "5")
    assert onnx_run.code == 0 and torch_run.code == 0, onnx_run.err + torch_run.err
    onnx_records = [json.loads(line) for line in onnx_run.out.splitlines()]
    torch_records = [json.loads(line) for line in torch_run.out.splitlines()]
    assert len(onnx_records) == len(torch_records) == 12
    for a, b in zip(onnx_records, torch_records, strict=True):
        assert a["label"] == b["label"]
        assert a["probs"]["pos"] == pytest.approx(b["probs"]["pos"], abs=1e-4)
    with open(test, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    direct = predictor.predict_texts(
        [r["premise"] for r in rows], batch_size=4, pairs=[r["hypothesis"] for r in rows]
    )
    assert np.allclose(direct.probs[:, 1], [r["probs"]["pos"] for r in onnx_records], atol=1e-6)
    missing = cli("predict", exported, "--data", test, "--text-column", "premise")
    assert missing.code == 1 and missing.out == ""
    assert "fine-tuned on text pairs; no pair texts were given" in missing.err


def test_models_without_a_record_take_pairs(
    cli: Callable[..., Any], tiny_bert_artifact: Path, pairs: dict[str, Path]
) -> None:
    """An untrained or imported model says nothing about its input: pairs are taken."""
    config = json.loads((tiny_bert_artifact / "config.json").read_text())
    assert "uqc_text_input" not in config
    result = cli("eval", tiny_bert_artifact, "--data", str(pairs["test"]), *PAIR_FLAGS)
    assert result.code == 0, result.err
