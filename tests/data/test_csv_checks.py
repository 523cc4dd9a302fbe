"""CSV problems `datasets` would report obscurely or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from uqcompress.data import load_data
from uqcompress.errors import DataError


def test_rows_with_extra_fields_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "shifted.csv"
    path.write_text("text,label\nfine,pos\nhi,pos,extra\n")
    with pytest.raises(DataError, match="row 3 has 3 fields; the header has 2"):
        load_data(str(path))


def test_non_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\ncafé,pos\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        load_data(str(path))


def test_quoted_commas_and_newlines_are_fields_not_rows(tmp_path: Path) -> None:
    path = tmp_path / "quoted.csv"
    path.write_text('text,label\n"one, two",pos\n"line one\nline two",neg\n')
    data = load_data(str(path))
    assert data.texts == ["one, two", "line one\nline two"]
    assert data.labels == ["pos", "neg"]
