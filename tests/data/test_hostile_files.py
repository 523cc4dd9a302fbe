"""Data files that used to crash or slip through: CSV cells over the csv
module's 131,072-character field limit, decompression-bomb images, duplicate column names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uqcompress.data import load_data
from uqcompress.errors import DataError

CSV_DEFAULT_FIELD_LIMIT = 131_072  # csv.field_size_limit() until something raises it
LONG = 200_000  # characters in one cell


def _long_rows() -> list[tuple[str, str]]:
    return [("good " * (LONG // 5), "pos"), ("bad film", "neg"), ("fine", "pos")]


def test_csv_cell_longer_than_the_csv_field_limit_loads_whole(tmp_path: Path) -> None:
    from tests.conftest import write_csv

    rows = _long_rows()
    assert len(rows[0][0]) > CSV_DEFAULT_FIELD_LIMIT
    data = load_data(str(write_csv(tmp_path / "long.csv", list(rows))))
    assert data.texts == [text for text, _ in rows]  # read whole; the tokenizer truncates
    assert data.labels == ["pos", "neg", "pos"]


def test_long_csv_cell_is_truncated_and_counted_like_jsonl(
    cli,
    tmp_path: Path,
    tiny_bert_artifact: Path,  # type: ignore[no-untyped-def]
) -> None:
    from tests.conftest import write_csv

    rows = _long_rows()
    as_csv = write_csv(tmp_path / "long.csv", list(rows))
    as_jsonl = tmp_path / "long.jsonl"
    as_jsonl.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    payloads = []
    for data in (as_csv, as_jsonl):
        result = cli("eval", str(tiny_bert_artifact), "--data", str(data), "--json")
        assert result.code == 0, result.err
        payloads.append(json.loads(result.out))
    for payload in payloads:
        assert payload["summary"]["truncated"] == 1
        assert any("1 texts were truncated" in w for w in payload["warnings"])
    csv_metrics = json.loads((Path(payloads[0]["path"]) / "metrics.json").read_text())
    jsonl_metrics = json.loads((Path(payloads[1]["path"]) / "metrics.json").read_text())
    for key in ("examples", "acc", "nll", "brier", "ece"):  # same examples, same numbers
        assert csv_metrics[key] == jsonl_metrics[key], key


def test_duplicate_csv_column_names_are_refused_naming_the_column(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("text,text,label\nfirst,second,pos\nthird,fourth,neg\n")
    with pytest.raises(DataError, match=r"two columns named 'text' \(columns 1 and 2\)"):
        load_data(str(path))


def test_duplicate_label_column_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text("label,text,label\npos,a,neg\n")
    with pytest.raises(DataError, match=r"two columns named 'label' \(columns 1 and 3\)"):
        load_data(str(path))


def test_duplicate_parquet_column_names_are_refused_naming_the_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "dup.parquet"
    columns = [pa.array(["a", "b"]), pa.array(["c", "d"]), pa.array(["pos", "neg"])]
    pq.write_table(pa.table(columns, names=["text", "text", "label"]), path)
    with pytest.raises(DataError, match=r"two columns named 'text'"):
        load_data(str(path))


def _bomb_folder(root: Path, side: int) -> Path:
    """A labelled image folder whose one image is `side` x `side` pixels. A 1-bit blank PNG
    of that size compresses to a few KB on disk (15000 x 15000: 27 KB)."""
    from PIL import Image

    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    Image.new("1", (side, side)).save(root / "a" / "big.png")
    Image.new("L", (8, 8)).save(root / "b" / "small.png")
    return root


@pytest.mark.parametrize(
    ("side", "pixels"),
    [(15000, "225,000,000"), (9500, "90,250,000")],
    ids=["over-pil-error-limit", "over-pil-warning-limit"],
)
def test_decompression_bomb_image_is_one_error_naming_file_and_size(
    tmp_path: Path, side: int, pixels: str
) -> None:
    folder = _bomb_folder(tmp_path / "imgs", side)
    with pytest.raises(DataError) as caught:
        load_data(str(folder))
    message = caught.value.message
    assert str(folder / "a" / "big.png") in message
    assert f"{side}x{side} pixels ({pixels})" in message
    assert caught.value.hint and "resize" in caught.value.hint


def test_bomb_check_leaves_pil_limit_as_it_was(tmp_path: Path) -> None:
    from PIL import Image

    before = Image.MAX_IMAGE_PIXELS
    with pytest.raises(DataError):
        load_data(str(_bomb_folder(tmp_path / "imgs", 15000)))
    assert before == Image.MAX_IMAGE_PIXELS


def test_decompression_bomb_via_cli_is_one_line(
    cli,
    tmp_path: Path,
    tiny_vit_artifact: Path,  # type: ignore[no-untyped-def]
) -> None:
    folder = _bomb_folder(tmp_path / "imgs", 15000)
    result = cli("eval", str(tiny_vit_artifact), "--data", str(folder))
    assert result.code == 1
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.err
    assert "big.png is 15000x15000 pixels" in lines[0]
