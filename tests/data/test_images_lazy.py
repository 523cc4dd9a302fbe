"""Images of any size and mode through the model's own image processor, read lazily per batch
(issue 18, items 1, 2 and 6)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uqcompress.data import load_data
from uqcompress.data.encoding import collate, encode, make_loader
from uqcompress.data.images import FileImages, augment_light, read_image
from uqcompress.errors import DataError
from uqcompress.models.factory import create_model
from uqcompress.models.loading import LoadedModel

# The processor's numpy path rescales in float64; uqc (and the ONNX Predictor) in float32.
ULP = 2.5e-7


@pytest.fixture(scope="module")
def rgb_vit() -> LoadedModel:
    """A tiny RGB ViT for 16x16 inputs: every image below is resized by its processor."""
    return create_model("vit", ["a", "b"], overrides={"num_channels": 3}, image_size=16)


def _photo(width: int = 40, height: int = 27, seed: int = 0) -> Any:
    """A seeded RGB image with structure (gradients + noise), so a slip in orientation or
    resizing shows in the pixels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) % 64 * 4], axis=-1)
    noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy, "RGB")


def _processor(loaded: LoadedModel, images: list[Any]) -> np.ndarray:
    """The model's image processor, called directly, as a user would."""
    from transformers import AutoImageProcessor

    assert loaded.preprocessing is not None
    processor = AutoImageProcessor.from_pretrained(_saved(loaded))
    return np.asarray(processor(images, return_tensors="np")["pixel_values"])


def _saved(loaded: LoadedModel) -> Path:
    """The model's processor config saved to a fresh folder (no cache keyed by `id()`: a
    collected model's id is reused by the next one, which once handed a 16-pixel model's
    processor to an 8-pixel one)."""
    import tempfile

    folder = Path(tempfile.mkdtemp())
    assert loaded.preprocessing is not None
    loaded.preprocessing.save(folder)
    return folder


def _through_uqc(loaded: LoadedModel, paths: list[Path]) -> np.ndarray:
    data = load_data(str(paths[0].parent), require_labels=False)
    order = [str(p) for p in paths]
    assert isinstance(data.images, FileImages)
    index = [data.images.paths.index(p) for p in order]
    encoded = encode(data, loaded, np.zeros(len(data), dtype=np.int64))
    return collate(encoded, index)["pixel_values"].numpy()


def test_one_image_in_every_format_and_mode_gives_the_processors_output(
    tmp_path: Path, rgb_vit: LoadedModel
) -> None:
    from PIL import Image

    original = _photo()
    folder = tmp_path / "same"
    folder.mkdir()
    original.save(folder / "a.png")
    original.save(folder / "b.jpg", quality=100)
    rgba = original.convert("RGBA")
    rgba.save(folder / "c.png")
    # Stored turned a quarter, with the EXIF flag (6: rotate 90 clockwise to view) that
    # turns it back.
    exif = Image.Exif()
    exif[0x0112] = 6
    original.transpose(Image.Transpose.ROTATE_90).save(folder / "d.png", exif=exif.tobytes())
    original.save(folder / "e.webp", lossless=True)
    original.save(folder / "f.bmp")
    names = ["a.png", "b.jpg", "c.png", "d.png", "e.webp", "f.bmp"]
    got = _through_uqc(rgb_vit, [folder / n for n in names])
    assert got.shape == (6, 3, 16, 16)

    want = _processor(rgb_vit, [original])[0]
    assert want.shape == (3, 16, 16) and want.std() > 0.2
    for i in (0, 2, 3, 4, 5):  # lossless copies, the EXIF-flagged one, RGBA: the original's
        np.testing.assert_allclose(got[i], want, atol=ULP, rtol=0, err_msg=names[i])
    jpeg = _processor(rgb_vit, [Image.open(folder / "b.jpg").convert("RGB")])[0]
    np.testing.assert_allclose(got[1], jpeg, atol=ULP, rtol=0)  # the JPEG's own pixels
    assert np.abs(got[1] - want).mean() < 0.02  # ... within JPEG's loss of the original
    # Without the EXIF turn the stored pixels would give something else entirely.
    stored = _processor(rgb_vit, [Image.open(folder / "d.png").convert("RGB")])[0]
    assert np.abs(stored - want).mean() > 0.1


def test_grey_palette_and_16_bit_images(tmp_path: Path, rgb_vit: LoadedModel) -> None:
    from PIL import Image

    grey = _photo(31, 45, seed=1).convert("L")
    levels = np.asarray(grey, dtype=np.uint16)
    folder = tmp_path / "modes"
    folder.mkdir()
    grey.save(folder / "a.png")
    sixteen = Image.fromarray((levels * 257).astype("<u2"))  # 16-bit: v * 257 -> v
    assert sixteen.mode == "I;16"
    sixteen.save(folder / "b.png")
    palette = _photo(seed=2).convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    palette.save(folder / "c.png")
    got = _through_uqc(rgb_vit, [folder / n for n in ("a.png", "b.png", "c.png")])
    want_grey = _processor(rgb_vit, [grey.convert("RGB")])[0]
    np.testing.assert_allclose(got[0], want_grey, atol=ULP, rtol=0)
    np.testing.assert_allclose(got[1], want_grey, atol=ULP, rtol=0)
    assert np.array_equal(got[1][0], got[1][1])  # grey repeated into R, G and B
    want_palette = _processor(rgb_vit, [palette.convert("RGB")])[0]
    np.testing.assert_allclose(got[2], want_palette, atol=ULP, rtol=0)

    # A grey model gets PIL's luma of a colour image (then its processor).
    grey_vit = create_model("vit", ["a", "b"], image_size=16)
    colour = _photo(seed=3)
    colour.save(folder / "d.png")
    data = load_data(str(folder), require_labels=False)
    assert isinstance(data.images, FileImages)
    pick = data.images.paths.index(str(folder / "d.png"))
    encoded = encode(data, grey_vit, np.zeros(len(data), dtype=np.int64))
    got_grey = collate(encoded, [pick])["pixel_values"].numpy()[0]
    want_luma = _processor(grey_vit, [colour.convert("L")])[0]
    assert got_grey.shape == (1, 16, 16)
    np.testing.assert_allclose(got_grey, want_luma, atol=ULP, rtol=0)


def test_digits_pixel_values_are_unchanged(tiny_vit_artifact: Path) -> None:
    """builtin:digits through the tiny ViT's processor: bit for bit what uqc computed before
    image processors (float32 rescale then normalise), so the demo's numbers stay."""
    from uqcompress.models.loading import load_model, resolve_model_source

    loaded = load_model(resolve_model_source(tiny_vit_artifact))
    for spec in ("builtin:digits@train", "builtin:photo-patches"):
        data = load_data(spec, require_labels=False)
        assert data.images is not None
        encoded = encode(data, loaded, np.zeros(len(data), dtype=np.int64))
        got = np.concatenate([b["pixel_values"].numpy() for b in make_loader(encoded, 100)])
        raw = data.images.as_pixels(1)
        before = (raw * np.float32(1 / 255) - np.float32(0.5)) / np.float32(0.5)
        assert got.dtype == np.float32 and np.array_equal(got, before), spec
        # The same pixels as the processor itself gives, to float32 rounding.
        images = [data.images.open(i, "L") for i in range(50)]
        np.testing.assert_allclose(got[:50], _processor(loaded, images), atol=ULP, rtol=0)


def test_augment_light_is_seeded_and_keeps_the_content(rgb_vit: LoadedModel) -> None:
    image = _photo(64, 48)
    a, b, c = augment_light(image, 1), augment_light(image, 1), augment_light(image, 2)
    assert a.tobytes() == b.tobytes() and a.size == b.size
    assert a.tobytes() != c.tobytes()
    for seed in range(20):
        w, h = augment_light(image, seed).size
        assert 0.78 * 64 * 48 <= w * h <= 64 * 48  # 80-100% of the area, rounded
        assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05


def _mixed_folder(root: Path, count: int = 60) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        label = i % 2
        w, h = int(rng.integers(6, 30)), int(rng.integers(6, 30))
        pixels = rng.integers(0, 80, (h, w)).astype(np.uint8)
        if label:  # a bright bar: learnable at any size
            pixels[h // 3 : 2 * h // 3] = 230
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        suffix = (".png", ".jpg")[i % 2]
        Image.fromarray(pixels, "L").save(folder / f"{i:03d}{suffix}")
    return root


def _weights_hash(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


def test_a_folder_of_mixed_sizes_trains_and_evaluates_with_workers(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    folder = _mixed_folder(tmp_path / "mixed")
    init = cli("init", "--family", "vit", "--labels", "0,1", "--out", tmp_path / "m")
    assert init.code == 0, init.err
    common = ("--data", folder, "--epochs", "2", "--batch-size", "16", "--augment", "light")
    one = cli("finetune", tmp_path / "m", *common, "--out", tmp_path / "f0")
    assert one.code == 0, one.err
    two = cli("finetune", tmp_path / "m", *common, "--workers", "2", "--out", tmp_path / "f2")
    assert two.code == 0, two.err
    # Order and augmentation draws come from the seed alone: workers change nothing.
    assert _weights_hash(tmp_path / "f0") == _weights_hash(tmp_path / "f2")
    plain = cli("finetune", tmp_path / "m", *common[:-2], "--out", tmp_path / "fn")
    assert plain.code == 0, plain.err
    assert _weights_hash(tmp_path / "fn") != _weights_hash(tmp_path / "f0")  # augmented
    result = cli("eval", tmp_path / "f2", "--data", folder, "--json", "--workers", "2")
    assert result.code == 0, result.err
    import json

    summary = json.loads(result.out)["summary"]
    assert 0.0 <= summary["acc"] <= 1.0 and summary["nll"] > 0


def test_a_damaged_image_found_while_reading_a_batch_is_one_error(
    tmp_path: Path, rgb_vit: LoadedModel
) -> None:
    """A file cut short is found by the header pass, before anything runs; one damaged after
    that pass is found when its batch is built, in a worker process, and reported as one
    DataError naming the file."""
    folder = tmp_path / "cut" / "a"
    folder.mkdir(parents=True)
    for i in range(8):
        _photo(seed=i).save(folder / f"{i}.jpg", quality=90)
    whole = (folder / "5.jpg").read_bytes()
    (folder / "5.jpg").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"cannot read image .*5\.jpg \(Truncated File Read\)"):
        load_data(str(tmp_path / "cut"))
    (folder / "5.jpg").write_bytes(whole)
    data = load_data(str(tmp_path / "cut"))
    (folder / "5.jpg").write_bytes(whole[: len(whole) // 2])  # damaged after the check
    for workers in (0, 2):
        encoded = encode(data, rgb_vit, np.zeros(8, dtype=np.int64), workers=workers)
        with pytest.raises(DataError) as caught:
            for _ in make_loader(encoded, 4):
                pass
        message = caught.value.message
        assert message.startswith(f"cannot read image {folder / '5.jpg'} (")
        assert "\n" not in message and "Traceback" not in message
        assert caught.value.hint == "replace or remove the damaged file"


def test_read_image_applies_exif_orientation(tmp_path: Path) -> None:
    from PIL import Image

    original = _photo(20, 10)
    exif = Image.Exif()
    exif[0x0112] = 8  # rotate 90 counter-clockwise to view
    original.transpose(Image.Transpose.ROTATE_270).save(tmp_path / "x.jpg", exif=exif, quality=95)
    upright = read_image(tmp_path / "x.jpg", "RGB")
    assert upright.size == (20, 10)
