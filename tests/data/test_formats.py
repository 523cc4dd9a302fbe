"""Data formats beyond CSV: JSON Lines, JSON, Parquet, image folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from uqcompress.data import load_data
from uqcompress.errors import DataError
from uqcompress.steps import eval as eval_step

ROWS = [("a great film", "pos"), ("awful and boring", "neg"), ("fun", "pos")]


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_json_and_parquet_read_like_csv(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"text": t, "label": y} for t, y in ROWS]
    jsonl = load_data(str(_jsonl(tmp_path / "d.jsonl", records)))
    (tmp_path / "d.json").write_text(json.dumps(records))
    plain = load_data(str(tmp_path / "d.json"))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    parquet = load_data(str(tmp_path / "d.parquet"))
    for data in (jsonl, plain, parquet):
        assert data.texts == [t for t, _ in ROWS] and data.labels == [y for _, y in ROWS]
    # a content fingerprint: the same rows in another format are the same data set
    assert jsonl.fingerprint == plain.fingerprint == parquet.fingerprint


def test_unparsable_and_incomplete_files_are_data_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a", "label": "pos"}\n{not json\n')
    with pytest.raises(DataError, match=r"broken\.jsonl line 2: not valid JSON \(Expecting"):
        load_data(str(broken))
    missing = _jsonl(tmp_path / "m.jsonl", [{"sentence": "a", "label": "pos"}])
    with pytest.raises(DataError, match="no column 'text'"):
        load_data(str(missing))
    mixed = _jsonl(
        tmp_path / "mixed.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": "pos"}]
    )
    with pytest.raises(DataError):
        data = load_data(str(mixed))
        from uqcompress.data.labels import map_labels

        map_labels(data, ["neg", "pos"], placeholder=False)


GOOD = '{"text": "a", "label": "pos"}'


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        # a null first line crashed the process inside datasets' JSON builder (exit 139)
        ("first.jsonl", f"null\n{GOOD}\n", "line 1: holds null, not a JSON object"),
        ("null.jsonl", f"{GOOD}\n\nnull\n", "line 3: holds null, not a JSON object"),
        ("list.jsonl", f"{GOOD}\n[1, 2]\n", "line 2: holds a list, not a JSON object"),
        ("number.jsonl", f"{GOOD}\n7\n", "line 2: holds a number, not a JSON object"),
        ("text.jsonl", f'{GOOD}\n"hi"\n', "line 2: holds a string, not a JSON object"),
        ("trail.jsonl", f"{GOOD}\n{GOOD} x\n", "line 2: not valid JSON (Extra data at column"),
        ("cut.jsonl", f'{GOOD}\n{{"text": \n', "line 2: not valid JSON (Expecting value"),
        ("items.json", f"[{GOOD},\n  null]", "line 2: item 2 holds null, not a JSON object"),
        ("doc.json", f"[{GOOD},\n {{oops}}]", "line 2: not valid JSON (Expecting property"),
        ("lines.json", f"{GOOD}\nnull\n", "line 2: holds null, not a JSON object"),
        ("empty.jsonl", "\n\n", "is empty"),
    ],
)
def test_json_lines_are_validated_line_by_line(
    tmp_path: Path, name: str, body: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(DataError) as caught:
        load_data(str(path))
    assert caught.value.message.startswith(f"{path} {message}"), caught.value.message
    assert "Trailing data" not in caught.value.message


def test_json_rows_are_named_by_their_file_line(tmp_path: Path) -> None:
    """Blank lines hold no record, and a JSON Lines file has no header: the row with a
    missing value is named by the line it is on."""
    path = tmp_path / "gaps.jsonl"
    path.write_text(f'{GOOD}\n\n{{"text": null, "label": "neg"}}\n')
    with pytest.raises(DataError, match=r"gaps\.jsonl line 3: empty 'text'"):
        load_data(str(path))
    separators = tmp_path / "seps.jsonl"  # separators JSON strings may hold unescaped
    separators.write_text('{"text": "a\u2028b\u0085c", "label": "pos"}\r\n', encoding="utf-8")
    assert load_data(str(separators)).texts == ["a\u2028b\u0085c"]
    multi = tmp_path / "one.json"  # one object over several lines is one record
    multi.write_text('{"text": "a",\n "label": "pos"}\n')
    assert load_data(str(multi)).texts == ["a"]


@pytest.mark.parametrize(
    ("cell", "kind"), [({"a": 1}, "a JSON object ({'a': 1})"), ([1, 2], "a list ([1, 2])")]
)
def test_nested_values_in_a_text_column_are_refused(
    tmp_path: Path, cell: object, kind: str
) -> None:
    """A JSON object as a text cell silently became the text "{'a': 1}"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {"text": "a", "first": "x", "other": "b", "label": "pos"},
        {"text": cell, "first": "y", "other": cell},
    ]
    records[1]["label"] = "neg"
    jsonl = _jsonl(tmp_path / "nested.jsonl", records)
    with pytest.raises(DataError) as caught:
        load_data(str(jsonl))
    assert caught.value.message == f"{jsonl} line 2: the 'text' cell holds {kind}, not text"
    with pytest.raises(DataError, match=f"line 2: the 'other' cell holds {kind[:6]}"):
        load_data(str(jsonl), text_column="first", text_pair_column="other")
    parquet = tmp_path / "nested.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": cell, "label": y} for y in ("a", "b")]), parquet)
    with pytest.raises(DataError, match=f"nested.parquet row 1: the 'text' cell holds {kind[:6]}"):
        load_data(str(parquet))


def _write_digit_pngs(root: Path, split: str) -> None:
    """The digits as a user would save them: 8-bit grey PNGs, one folder per class."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from uqcompress.data.builtin import _digits_splits

    bunch = load_digits()
    for i in _digits_splits()[split]:
        folder = root / str(bunch.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.round(bunch.images[i] * 255.0 / 16.0).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"{i:04d}.png")


def test_digits_as_png_folder_score_identically(tmp_path: Path, tiny_vit_artifact: Path) -> None:
    from uqcompress.data.builtin import _digits_splits
    from uqcompress.export.source import open_source

    _write_digit_pngs(tmp_path / "pngs", "val")
    folder = load_data(str(tmp_path / "pngs"))
    builtin = load_data("builtin:digits@val")
    assert folder.images is not None and builtin.images is not None
    folder_pixels, builtin_pixels = folder.images.as_pixels(1), builtin.images.as_pixels(1)
    assert folder_pixels.shape == (180, 1, 8, 8)
    # Put the folder's examples (class folders, file names = dataset index) in builtin order.
    names = sorted(tmp_path.glob("pngs/*/*.png"), key=lambda p: (p.parent.name, p.name))
    position = {int(p.stem): i for i, p in enumerate(names)}
    order = [position[int(i)] for i in _digits_splits()["val"]]
    assert np.array_equal(folder_pixels[order], builtin_pixels)  # bit for bit
    assert [folder.labels[i] for i in order] == [str(y) for y in builtin.labels]
    source = open_source(tiny_vit_artifact, "model")
    from_builtin = source.predict(builtin, batch_size=64, max_length=None)
    from_folder = source.predict(folder, batch_size=64, max_length=None)
    assert np.array_equal(from_folder.probs[order].argmax(1), from_builtin.probs.argmax(1))
    assert np.abs(from_folder.probs[order] - from_builtin.probs).max() < 1e-6
    a = eval_step.run(
        [tiny_vit_artifact], eval_step.EvalConfig(data="builtin:digits@val"), tmp_path / "e1"
    ).artifact.manifest.summary
    b = eval_step.run(
        [tiny_vit_artifact], eval_step.EvalConfig(data=str(tmp_path / "pngs")), tmp_path / "e2"
    ).artifact.manifest.summary
    for key in ("acc", "nll", "brier", "ece"):
        assert a[key] == pytest.approx(b[key], abs=1e-7), key


def test_colour_images_feed_a_grey_model_through_luma(tmp_path: Path) -> None:
    from PIL import Image

    for label in ("0", "1"):
        (tmp_path / "rgb" / label).mkdir(parents=True)
        rgb = np.random.default_rng(int(label)).integers(0, 256, (8, 8, 3)).astype(np.uint8)
        Image.fromarray(rgb, mode="RGB").save(tmp_path / "rgb" / label / "x.png")
    data = load_data(str(tmp_path / "rgb"))
    assert data.images is not None and data.images.as_pixels(3).shape == (2, 3, 8, 8)
    grey = data.images.as_pixels(1)  # a grey model gets PIL's ITU-R 601-2 luma
    expected = np.asarray(Image.open(tmp_path / "rgb" / "0" / "x.png").convert("L"), np.float32)
    assert np.array_equal(grey[0, 0], expected)


def test_bad_image_folders(tmp_path: Path) -> None:

    (tmp_path / "corrupt" / "a").mkdir(parents=True)
    (tmp_path / "corrupt" / "a" / "bad.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match=r"cannot read image .*bad\.png"):
        load_data(str(tmp_path / "corrupt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no \.png/\.jpg/\.jpeg/\.webp/\.bmp images"):
        load_data(str(tmp_path / "empty"))


def test_an_output_inside_an_input_data_folder_is_refused(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    """Issue 26 item 16: an artifact written into the image folder it reads would become a new
    class of that data; every output path is checked against every input, data included."""
    _write_digit_pngs(tmp_path / "pngs", "val")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    for out in (tmp_path / "pngs" / "eval", tmp_path / "pngs"):
        result = cli(
            "eval", tiny_vit_artifact, "--data", tmp_path / "pngs", "--out", out, "--force"
        )
        assert result.code == 1 and result.out == "", result.err
        assert "overlaps the input" in result.err and len(result.err.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
