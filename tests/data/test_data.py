"""Data specs, built-in digits, CSV loading, label mapping, encoding and batching."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import sentiment_rows, write_csv
from uqcompress.data import load_data, parse_spec
from uqcompress.data.builtin import _digits_splits, load_digits_split
from uqcompress.data.dataset import LabeledData
from uqcompress.data.encoding import EncodedData, collate, encode
from uqcompress.data.images import ArrayImages
from uqcompress.data.labels import map_labels
from uqcompress.errors import DataError
from uqcompress.models.loading import LoadedModel, load_model, resolve_model_source

SPLIT_SIZES = {"train": 1257, "val": 180, "test": 360}


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_loaded(tiny_bert_artifact: Path) -> LoadedModel:
    return load_model(resolve_model_source(tiny_bert_artifact))


@pytest.fixture(scope="module")
def vit_loaded(tiny_vit_artifact: Path) -> LoadedModel:
    return load_model(resolve_model_source(tiny_vit_artifact))


@pytest.fixture(scope="module")
def digits() -> dict[str, LabeledData]:
    return {split: load_data(f"builtin:digits@{split}") for split in SPLIT_SIZES}


def _rows_counter(data: LabeledData) -> Counter[tuple[bytes, int]]:
    assert data.images is not None
    return Counter(
        (np.ascontiguousarray(image).tobytes(), int(label))
        for image, label in zip(data.images.as_pixels(1), data.labels, strict=True)
    )


# --- builtin:digits ---------------------------------------------------------------------------


def test_digits_split_sizes(digits: dict[str, LabeledData]) -> None:
    assert {split: len(data) for split, data in digits.items()} == SPLIT_SIZES
    assert sum(SPLIT_SIZES.values()) == 1797
    for split, data in digits.items():
        assert data.input_kind == "image"
        assert data.spec == f"builtin:digits@{split}"
        assert data.label_names == [str(d) for d in range(10)]


def test_digits_default_split_is_train(digits: dict[str, LabeledData]) -> None:
    spec = parse_spec("builtin:digits")
    assert (spec.kind, spec.name, spec.split) == ("builtin", "digits", "train")
    assert load_data("builtin:digits").fingerprint == digits["train"].fingerprint


def test_digits_splits_are_disjoint_and_cover_everything(
    digits: dict[str, LabeledData],
) -> None:
    from sklearn.datasets import load_digits

    # By index: a partition of 0..1796.
    index = _digits_splits()
    sets = {split: set(map(int, values)) for split, values in index.items()}
    assert not sets["train"] & sets["val"]
    assert not sets["train"] & sets["test"]
    assert not sets["val"] & sets["test"]
    assert sets["train"] | sets["val"] | sets["test"] == set(range(1797))

    # By content: the (image, label) multisets of the splits add up to the whole data set.
    bunch = load_digits()
    whole = LabeledData(
        spec="whole",
        input_kind="image",
        labels=[int(v) for v in bunch.target],
        fingerprint="",
        images=ArrayImages(np.round(bunch.images * 255.0 / 16.0).astype(np.uint8)),
    )
    combined = sum((_rows_counter(data) for data in digits.values()), Counter())
    assert combined == _rows_counter(whole)


def test_digits_splits_are_stratified(digits: dict[str, LabeledData]) -> None:
    from sklearn.datasets import load_digits

    target = load_digits().target
    whole = np.bincount(target, minlength=10) / len(target)
    for split, data in digits.items():
        counts = np.bincount(np.asarray(data.labels), minlength=10)
        assert (counts > 0).all(), f"{split} lacks a class: {counts}"
        assert np.abs(counts / len(data) - whole).max() < 0.015, split


def test_digits_are_deterministic(digits: dict[str, LabeledData]) -> None:
    _digits_splits.cache_clear()  # split again from scratch
    again = load_digits_split("train")
    assert again.fingerprint == digits["train"].fingerprint
    assert again.labels == digits["train"].labels
    assert again.images is not None and digits["train"].images is not None
    np.testing.assert_array_equal(again.images.as_pixels(1), digits["train"].images.as_pixels(1))
    fingerprints = {data.fingerprint for data in digits.values()}
    assert len(fingerprints) == 3


def test_digits_images_are_on_the_0_255_scale(digits: dict[str, LabeledData]) -> None:
    allowed = np.round(np.arange(17) * 255.0 / 16.0).astype(np.float32)  # 8-bit grey levels
    for data in digits.values():
        assert data.images is not None
        images = data.images.as_pixels(1)
        assert images.shape == (len(data), 1, 8, 8)
        assert images.dtype == np.float32
        assert float(images.max()) == 255.0
        assert float(images.min()) == 0.0
        assert np.isin(images, allowed).all()


def test_digits_images_are_the_sklearn_pixels_scaled() -> None:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    index = _digits_splits()["val"]
    data = load_digits_split("val")
    assert data.images is not None
    expected = np.round(bunch.images[index] * 255.0 / 16.0)  # quantised like an 8-bit image
    np.testing.assert_array_equal(data.images.as_pixels(1)[:, 0], expected.astype(np.float32))
    assert data.labels == [int(v) for v in bunch.target[index]]


# --- parse_spec errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("builtin:nope", "nope"),
        ("builtin:digits@nope", "nope"),
        ("data.txt", "data.txt"),
        ("", "empty"),
        ("   ", "empty"),
    ],
)
def test_parse_spec_rejects(spec: str, needle: str) -> None:
    with pytest.raises(DataError) as info:
        parse_spec(spec)
    assert needle in info.value.message
    assert info.value.hint


def test_parse_spec_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.csv"
    with pytest.raises(DataError, match=re.escape("missing.csv")):
        parse_spec(str(missing))


def test_parse_spec_unknown_suffix_even_if_the_file_exists(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("text,label\ngood,pos\n")
    with pytest.raises(DataError, match=re.escape("data.txt")):
        parse_spec(str(path))


def test_parse_spec_accepts_csv(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("good", "pos")])
    spec = parse_spec(str(path))
    assert spec.kind == "file"
    assert spec.name == str(path)


# --- CSV through load_data + map_labels --------------------------------------------------------


def test_csv_string_labels_map_to_model_labels(tmp_path: Path) -> None:
    rows = sentiment_rows(10, seed=3)
    data = load_data(str(write_csv(tmp_path / "d.csv", list(rows))))
    assert data.input_kind == "text"
    assert data.texts == [text for text, _ in rows]
    assert len(data) == 10
    mapping = map_labels(data, ["neg", "pos"], placeholder=False)
    assert mapping.adopted_labels is None
    assert mapping.ids.dtype == np.int64
    assert mapping.ids.tolist() == [1 if label == "pos" else 0 for _, label in rows]
    # Label order is the model's, not the data's.
    reversed_ids = map_labels(data, ["pos", "neg"], placeholder=False).ids
    assert reversed_ids.tolist() == [0 if label == "pos" else 1 for _, label in rows]


def test_csv_int_labels_are_class_indices(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("good", 1), ("bad", 0), ("fun", 2)])
    data = load_data(str(path))
    mapping = map_labels(data, ["a", "b", "c"], placeholder=False)
    assert mapping.ids.tolist() == [1, 0, 2]
    assert mapping.adopted_labels is None


def test_csv_placeholder_labels_adopt_sorted_distinct_strings(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("good", "pos"), ("bad", "neg"), ("fun", "pos")])
    data = load_data(str(path))
    mapping = map_labels(data, ["LABEL_0", "LABEL_1"], placeholder=True)
    assert mapping.adopted_labels == ["neg", "pos"]
    assert mapping.ids.tolist() == [1, 0, 1]


def test_placeholder_labels_with_wrong_class_count(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("a", "x"), ("b", "y"), ("c", "z")])
    data = load_data(str(path))
    with pytest.raises(DataError, match="3"):
        map_labels(data, ["LABEL_0", "LABEL_1"], placeholder=True)


def test_csv_unknown_label_is_named(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("good", "pos"), ("hmm", "maybe"), ("bad", "neg")])
    data = load_data(str(path))
    with pytest.raises(DataError) as info:
        map_labels(data, ["neg", "pos"], placeholder=False)
    assert "maybe" in info.value.message
    assert "d.csv" in info.value.message


def test_mixed_int_and_string_labels() -> None:
    data = LabeledData(
        spec="mixed", input_kind="text", labels=[0, "pos"], fingerprint="x", texts=["a", "b"]
    )
    with pytest.raises(DataError, match="mixes"):
        map_labels(data, ["neg", "pos"], placeholder=False)


def test_csv_mixed_int_and_string_labels(tmp_path: Path) -> None:
    # A CSV column holding both reads as strings, so the integer is an unknown label name.
    path = write_csv(tmp_path / "d.csv", [("good", "0"), ("bad", "pos")])
    data = load_data(str(path))
    with pytest.raises(DataError) as info:
        map_labels(data, ["neg", "pos"], placeholder=False)
    assert "0" in info.value.message


def test_csv_int_label_out_of_range(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("good", 0), ("bad", 1), ("odd", 2), ("neg", -1)])
    data = load_data(str(path))
    with pytest.raises(DataError) as info:
        map_labels(data, ["neg", "pos"], placeholder=False)
    assert "2" in info.value.message
    assert "-1" in info.value.message


def test_csv_missing_column_names_the_available_ones(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [("good", "pos")], header=("sentence", "label"))
    with pytest.raises(DataError) as info:
        load_data(str(path))
    assert "'text'" in info.value.message
    assert "sentence" in info.value.message and "label" in info.value.message
    assert info.value.hint is not None and "--text-column" in info.value.hint
    with pytest.raises(DataError) as info:
        load_data(str(path), text_column="sentence", label_column="target")
    assert "target" in info.value.message and "sentence" in info.value.message
    assert info.value.hint is not None and "--label-column" in info.value.hint
    assert len(load_data(str(path), text_column="sentence")) == 1


def test_csv_with_header_only_is_refused(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "empty.csv", [])
    with pytest.raises(DataError) as info:
        load_data(str(path))
    assert "empty.csv" in info.value.message


def test_csv_fingerprint_follows_contents_not_name(tmp_path: Path) -> None:
    rows: list[tuple[object, object]] = list(sentiment_rows(8, seed=4))
    original = write_csv(tmp_path / "a.csv", rows)
    first = load_data(str(original))
    assert load_data(str(original)).fingerprint == first.fingerprint

    copy = tmp_path / "renamed-copy.csv"
    shutil.copyfile(original, copy)
    assert load_data(str(copy)).fingerprint == first.fingerprint

    edited_rows = list(rows)
    edited_rows[3] = (str(rows[3][0]) + " fun", rows[3][1])
    edited = write_csv(tmp_path / "b.csv", edited_rows)
    assert load_data(str(edited)).fingerprint != first.fingerprint

    relabelled = list(rows)
    relabelled[0] = (rows[0][0], "neg" if rows[0][1] == "pos" else "pos")
    assert load_data(str(write_csv(tmp_path / "c.csv", relabelled))).fingerprint != (
        first.fingerprint
    )


# --- encode ------------------------------------------------------------------------------------


def _text_data(texts: list[str]) -> LabeledData:
    return LabeledData(
        spec="texts", input_kind="text", labels=[0] * len(texts), fingerprint="t", texts=texts
    )


TEXTS = [
    "good",  # [CLS] good [SEP] = 3 tokens
    "good movie",  # 4
    "the movie was good",  # 6
    "the movie was really very good",  # 8
]


def test_encode_text_counts_truncation(bert_loaded: LoadedModel) -> None:
    data = _text_data(TEXTS)
    ids = np.zeros(len(TEXTS), dtype=np.int64)
    full = encode(data, bert_loaded, ids)
    assert full.truncated == 0
    assert [len(row) for row in full.input_ids or []] == [3, 4, 6, 8]

    short = encode(data, bert_loaded, ids, max_length=5)
    assert short.truncated == 2
    assert short.input_ids is not None
    assert [len(row) for row in short.input_ids] == [3, 4, 5, 5]
    assert short.input_ids[:2] == (full.input_ids or [])[:2]
    sep = (full.input_ids or [])[0][-1]
    assert all(row[-1] == sep for row in short.input_ids)  # still ends with [SEP]
    assert short.labels is ids


@pytest.mark.parametrize("family", ["bert", "qwen2"])
@pytest.mark.parametrize("blank", ["", "   ", "\t\n", "[CLS] [SEP]"])
def test_encode_refuses_a_text_with_no_real_token(family: str, blank: str) -> None:
    """Issue 26 item 11: a row that tokenises to padding or special tokens only (BERT:
    [CLS] [SEP]; Qwen2: nothing at all, a fully padded row) is one DataError naming it."""
    from uqcompress.models.factory import create_model

    loaded = create_model(family, ["neg", "pos"], preset="tiny")
    data = _text_data(["good movie", "bad", blank, "fine"])
    with pytest.raises(DataError, match="texts: example 3 of 4 has no real token") as info:
        encode(data, loaded, np.zeros(4, dtype=np.int64))
    assert info.value.hint is not None and "empty" in info.value.hint
    kept = encode(_text_data(["good movie", "a", "☃☃"]), loaded, np.zeros(3, dtype=np.int64))
    assert kept.input_ids is not None and len(kept.input_ids) == 3  # one real token is enough
    assert kept.input_ids[2] == [2, loaded.tokenizer.unk_token_id, 3]  # [UNK] is real text


def test_encode_image_applies_saved_preprocessing(
    vit_loaded: LoadedModel, digits: dict[str, LabeledData]
) -> None:
    data = digits["val"]
    assert data.images is not None
    ids = np.asarray(data.labels, dtype=np.int64)
    encoded = encode(data, vit_loaded, ids)
    assert encoded.input_kind == "image"
    pixel_values = collate(encoded, list(range(len(data))))["pixel_values"].numpy()
    assert pixel_values.dtype == np.float32
    assert pixel_values.shape == (len(data), 1, 8, 8)
    expected = (data.images.as_pixels(1) / 255.0 - 0.5) / 0.5
    np.testing.assert_allclose(pixel_values, expected, rtol=0, atol=1e-5)
    assert float(pixel_values.min()) == pytest.approx(-1.0)
    assert float(pixel_values.max()) == pytest.approx(1.0)


def test_encode_image_model_refuses_text(vit_loaded: LoadedModel) -> None:
    with pytest.raises(DataError) as info:
        encode(_text_data(["good"]), vit_loaded, np.zeros(1, dtype=np.int64))
    assert "text" in info.value.message and "image" in info.value.message


def test_encode_text_model_refuses_images(
    bert_loaded: LoadedModel, digits: dict[str, LabeledData]
) -> None:
    with pytest.raises(DataError):
        encode(digits["val"], bert_loaded, np.zeros(len(digits["val"]), dtype=np.int64))


# --- collate -----------------------------------------------------------------------------------


def test_collate_pads_text_per_batch(bert_loaded: LoadedModel) -> None:
    import torch

    encoded = encode(_text_data(TEXTS), bert_loaded, np.arange(4, dtype=np.int64))
    assert encoded.pad_token_id == 0
    rows = encoded.input_ids
    assert rows is not None

    batch: dict[str, Any] = collate(encoded, [0, 3, 1])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (3, 8) and mask.shape == (3, 8)
    assert ids.dtype == torch.long and mask.dtype == torch.long
    assert batch["labels"].tolist() == [0, 3, 1]
    assert batch["token_type_ids"].shape == (3, 8)
    for i, source in enumerate([0, 3, 1]):
        n = len(rows[source])
        assert ids[i, :n].tolist() == rows[source]
        assert ids[i, n:].tolist() == [0] * (8 - n)
        assert mask[i, :n].tolist() == [1] * n
        assert mask[i, n:].tolist() == [0] * (8 - n)

    # Padding is to the longest example of *this* batch, not of the data set.
    small = collate(encoded, [0, 1])
    assert small["input_ids"].shape == (2, 4)
    assert small["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert small["input_ids"][0, 3].item() == 0


def test_collate_images(vit_loaded: LoadedModel, digits: dict[str, LabeledData]) -> None:
    data = digits["val"]
    encoded: EncodedData = encode(data, vit_loaded, np.asarray(data.labels, dtype=np.int64))
    batch = collate(encoded, [2, 0])
    assert tuple(batch["pixel_values"].shape) == (2, 1, 8, 8)
    assert batch["labels"].tolist() == [data.labels[2], data.labels[0]]
    assert "input_ids" not in batch
