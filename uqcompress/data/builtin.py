"""Data sets that ship inside installed packages (no download, ever).

`builtin:digits`: scikit-learn's 1,797 8x8 handwritten digits, 10 classes. Split once,
stratified by class, with seed 0: 70% `train`, 10% `val`, 20% `test` (1257 / 180 / 360).
Pixel values 0..16 are presented as 8-bit grey images, round(value * 255 / 16) on the usual
0..255 scale, held as 8-bit grey `[N, 8, 8]` images: the model's saved preprocessing is the
standard one, and the same digits saved as 8-bit grey PNGs in an image folder score identically.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts.hashing import sha256_bytes
from uqcompress.data.dataset import LabeledData
from uqcompress.data.images import ArrayImages

DIGITS_SEED = 0
DIGITS_SCALE = 255.0 / 16.0


@cache
def _digits_splits() -> dict[str, npt.NDArray[np.int64]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    labels = load_digits().target
    index = np.arange(len(labels))
    rest, test = train_test_split(index, test_size=0.2, stratify=labels, random_state=DIGITS_SEED)
    # 10% of the whole = 12.5% of the remaining 80%.
    train, val = train_test_split(
        rest, test_size=0.125, stratify=labels[rest], random_state=DIGITS_SEED
    )
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def load_digits_split(split: str) -> LabeledData:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    index = _digits_splits()[split]
    # Quantised like any 8-bit image, so a PNG of the digit holds exactly these values.
    images = np.round(bunch.images[index].astype(np.float64) * DIGITS_SCALE).astype(np.float32)
    images = images[:, None, :, :]
    labels = bunch.target[index].astype(np.int64)
    # The fingerprint hashes the float32 [N, 1, 8, 8] values, as it always has (ids stay).
    fingerprint = sha256_bytes(
        b"digits\0" + np.ascontiguousarray(images).tobytes() + labels.tobytes()
    )[:32]
    return LabeledData(
        spec=f"builtin:digits@{split}",
        input_kind="image",
        images=ArrayImages(images[:, 0].astype(np.uint8)),
        labels=[int(v) for v in labels],
        label_names=[str(d) for d in range(10)],
        fingerprint=fingerprint,
    )


PHOTO_PATCHES = 1000
PHOTO_PATCHES_SEED = 0


@cache
def _photo_patch_pixels() -> npt.NDArray[np.float32]:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    tiles = []
    for photo in load_sample_images().images:  # china.jpg, flower.jpg: 427 x 640 RGB each
        grey = np.asarray(Image.fromarray(photo).convert("L"), dtype=np.float32)
        rows, cols = grey.shape[0] // 8, grey.shape[1] // 8
        # [rows*8, cols*8] -> [rows, 8, cols, 8] -> [rows, cols, 8, 8]: non-overlapping tiles.
        cut = grey[: rows * 8, : cols * 8].reshape(rows, 8, cols, 8).transpose(0, 2, 1, 3)
        tiles.append(cut.reshape(-1, 8, 8))
    every = np.concatenate(tiles, axis=0)  # [8480, 8, 8]
    pick = np.sort(
        np.random.default_rng(PHOTO_PATCHES_SEED).choice(len(every), PHOTO_PATCHES, replace=False)
    )
    return every[pick][:, None, :, :]  # [1000, 1, 8, 8]


def load_photo_patches() -> LabeledData:
    """`builtin:photo-patches`: out-of-distribution images for digit models.

    Non-overlapping 8x8 tiles cut from scikit-learn's two bundled sample photographs
    (china.jpg, flower.jpg), converted to grey with PIL's ITU-R 601-2 luma ("L"), a seeded
    sample of 1,000 (numpy default_rng(0), without replacement, in tile order). On the digits'
    0..16 scale a tile is grey / 255 * 16; presented like the digits (value * 255 / 16) that is
    the grey value itself on the 0..255 scale. Unlabelled.
    """
    images = _photo_patch_pixels()
    return LabeledData(
        spec="builtin:photo-patches",
        input_kind="image",
        images=ArrayImages(images[:, 0].astype(np.uint8)),  # grey values, 0..255 integers
        labels=None,
        fingerprint=sha256_bytes(b"photo-patches\0" + np.ascontiguousarray(images).tobytes())[:32],
    )
