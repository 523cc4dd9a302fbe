"""Label mapping rules: names, indices, integer names, placeholders, odd label types."""

from __future__ import annotations

import numpy as np
import pytest

from uqcompress.data.dataset import LabeledData
from uqcompress.data.labels import map_labels
from uqcompress.errors import DataError


def _data(labels: list[object], names: list[str] | None = None) -> LabeledData:
    return LabeledData(
        spec="t.csv",
        input_kind="text",
        labels=labels,
        fingerprint="x",
        texts=["a"] * len(labels),
        label_names=names,
    )


def test_integer_labels_match_integer_names_by_name() -> None:
    mapping = map_labels(_data([1, 3, 2]), ["1", "2", "3"], placeholder=False)
    assert mapping.ids.tolist() == [0, 2, 1]
    with pytest.raises(DataError, match="'0'"):
        map_labels(_data([0, 1]), ["1", "2", "3"], placeholder=False)


def test_integer_labels_are_indices_under_word_names() -> None:
    assert map_labels(_data([1, 0]), ["neg", "pos"], False).ids.tolist() == [1, 0]
    with pytest.raises(DataError, match="outside the model's 2 classes"):
        map_labels(_data([2]), ["neg", "pos"], False)


def test_placeholder_models_adopt_names() -> None:
    signed = map_labels(_data([-1, 1, 1]), ["LABEL_0", "LABEL_1"], placeholder=True)
    assert signed.adopted_labels == ["-1", "1"] and signed.ids.tolist() == [0, 1, 1]
    plain = map_labels(_data([1, 0]), ["LABEL_0", "LABEL_1"], placeholder=True)
    assert plain.adopted_labels == ["0", "1"] and plain.ids.tolist() == [1, 0]
    named = map_labels(_data([2, 0], names=["a", "b", "c"]), ["LABEL_0"] * 3, placeholder=True)
    assert named.adopted_labels == ["a", "b", "c"] and named.ids.tolist() == [2, 0]
    words = map_labels(_data(["pos", "neg"]), ["LABEL_0", "LABEL_1"], placeholder=True)
    assert words.adopted_labels == ["neg", "pos"] and words.ids.tolist() == [1, 0]


def test_integral_floats_are_classes_other_types_are_refused() -> None:
    assert map_labels(_data([1.0, 0.0]), ["neg", "pos"], False).ids.tolist() == [1, 0]
    with pytest.raises(DataError, match="fractional"):
        map_labels(_data([0.5]), ["neg", "pos"], False)
    with pytest.raises(DataError, match="boolean"):
        map_labels(_data([True, False]), ["neg", "pos"], False)
    with pytest.raises(DataError, match="boolean"):
        map_labels(_data([np.bool_(True)]), ["neg", "pos"], False)


@pytest.mark.parametrize("label", [1e300, -1e300, 2**70])
def test_huge_integral_labels_are_refused_not_an_overflow(label: object) -> None:
    """1e300 is an integral float: int64 overflowed (OverflowError traceback)."""
    with pytest.raises(DataError, match=r"has a label out of range \((-?1e\+300|1\.18059e\+21)\)"):
        map_labels(_data([label, 0]), ["neg", "pos"], False)
    with pytest.raises(DataError, match="has a label out of range"):
        map_labels(_data([label, 0]), ["LABEL_0", "LABEL_1"], True)
