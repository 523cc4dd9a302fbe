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
    with pytest.raises(DataError, match=r"cannot read .*broken\.jsonl as JSON Lines"):
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
    from uqcompress.steps.sources import open_source

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
