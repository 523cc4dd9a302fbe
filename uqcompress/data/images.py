"""Images, read lazily: files in a folder (`DIR/<class>/*` labelled, `DIR/*` unlabelled) or
in-memory arrays (the built-in sets).

A data set keeps image *sources*, never one big pixel array: each image is opened when a
batch needs it (in the data loader's worker processes with `--workers N`), turned into the
model's mode (`L` for one channel, `RGB` for three) and handed to the model's image
processor (`models/preprocessing.py`), which resizes and crops it. Any size and mode is
read: JPEG, PNG, WebP and BMP; grey, RGB, RGBA and LA (alpha dropped, as transformers'
`convert_rgb` does), palette, 1-bit, 16-bit grey (scaled to 0..255 and rounded); the EXIF
orientation is applied.

Reading a folder hashes every file (the content fingerprint) and parses its header with
PIL (`Image.verify`), so an unreadable file among thousands fails in one line naming it
before any training starts; a file whose header is fine but whose pixels are damaged fails
the same way when its batch is built.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts.hashing import sha256_bytes
from uqcompress.data.dataset import LabeledData
from uqcompress.data.image_source import ImageSource
from uqcompress.errors import DataError

if TYPE_CHECKING:
    from PIL import Image as PILImage

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
AUGMENTS = ("none", "light")
# --augment light: random resized crop keeping 80-100% of the area at aspect 3:4..4:3, then a
# shift of up to 5% of each side (what leaves the image is black); never a flip.
CROP_SCALE = (0.8, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
SHIFT = 0.05


class ArrayImages(ImageSource):
    """Images held as 8-bit pixels: `[N, H, W]` grey or `[N, H, W, 3]` RGB, uint8."""

    def __init__(self, pixels: npt.NDArray[np.uint8]) -> None:
        self.pixels = pixels

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    def open(self, index: int, mode: str) -> PILImage.Image:
        from PIL import Image

        pixels = self.pixels[index]
        image = Image.fromarray(pixels, "L" if pixels.ndim == 2 else "RGB")
        return image if image.mode == mode else image.convert(mode)

    def subset(self, indices: Sequence[int]) -> ImageSource:
        return ArrayImages(self.pixels[np.asarray(indices, dtype=np.int64)])


class FileImages(ImageSource):
    """Image files, read when a batch needs them."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def open(self, index: int, mode: str) -> PILImage.Image:
        return read_image(Path(self.paths[index]), mode)

    def subset(self, indices: Sequence[int]) -> ImageSource:
        return FileImages([self.paths[i] for i in indices])


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def load_image_folder(root: Path, require_labels: bool = True) -> LabeledData:
    """An image folder as lazily read examples; every file is hashed and its header checked."""
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files: list[Path] = []
    labels: list[str] = []
    for folder in classes:
        found = _images_in(folder)
        files += found
        labels += [folder.name] * len(found)
    unlabelled = _images_in(root)
    if not files and unlabelled and not require_labels:
        files, labels = unlabelled, []
    if not files:
        hint = "put images in DIR/<class>/*.png (or DIR/*.png for unlabelled data)"
        raise DataError(
            f"{root} holds no {'/'.join(IMAGE_SUFFIXES)} images in class folders", hint=hint
        )
    digest = hashlib.sha256(b"image-folder\0")
    for number, path in enumerate(files):
        data = path.read_bytes()
        _check_header(path, data)
        line = f"{path.relative_to(root).as_posix()}\0{sha256_bytes(data)}"
        digest.update((line if number == 0 else "\n" + line).encode())
    return LabeledData(
        spec=str(root),
        input_kind="image",
        images=FileImages([str(p) for p in files]),
        labels=labels or None,
        fingerprint=digest.hexdigest()[:32],
    )


def _check_header(path: Path, data: bytes) -> None:
    """Parse the file's header (and, for PNG, its chunk checksums) without decoding pixels."""
    from PIL import Image

    with _readable(path), Image.open(io.BytesIO(data)) as image:
        image.verify()


class _readable:
    """Turns PIL's failures on one file into one DataError naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._warnings = warnings.catch_warnings()

    def __enter__(self) -> None:
        from PIL import Image

        self._warnings.__enter__()
        # Above Image.MAX_IMAGE_PIXELS PIL only warns (above twice that it raises); either way
        # such a file would cost gigabytes decoded, far beyond any classifier input.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        warnings.simplefilter("ignore", UserWarning)  # palette transparency notes and such

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        from PIL import Image, UnidentifiedImageError

        self._warnings.__exit__(kind, exc, tb)
        if exc is None or isinstance(exc, DataError):
            return
        if isinstance(exc, Image.DecompressionBombError | Image.DecompressionBombWarning):
            raise DataError(
                f"image {self.path} is {_size_text(self.path)}, more than the "
                f"{Image.MAX_IMAGE_PIXELS:,} pixels uqc reads from one image (a possible "
                "decompression bomb)",
                hint="resize the image to the model's input size, or remove it",
            ) from exc
        if isinstance(exc, UnidentifiedImageError | OSError | ValueError | SyntaxError | EOFError):
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise DataError(
                f"cannot read image {self.path} ({reason})",
                hint="replace or remove the damaged file",
            ) from exc


def read_image(path: Path, mode: str) -> PILImage.Image:
    """One image file, EXIF orientation applied, in `mode` (`L` or `RGB`)."""
    from PIL import Image, ImageOps

    with _readable(path), Image.open(path) as image:
        image.load()
        upright = ImageOps.exif_transpose(image) or image
        return to_mode(upright, mode)


def to_mode(image: PILImage.Image, mode: str) -> PILImage.Image:
    """Any PIL image in `mode` (`L` or `RGB`): 16-bit grey is scaled to 0..255 and rounded,
    alpha is dropped, palette and 1-bit images are expanded, colour becomes luma (PIL's
    ITU-R 601-2 `convert("L")`) for a grey model and grey repeats for an RGB model."""
    from PIL import Image

    if image.mode in _SIXTEEN_BIT:
        values = np.asarray(image.convert("I"), dtype=np.float64) * (255.0 / 65535.0)
        image = Image.fromarray(np.clip(np.round(values), 0, 255).astype(np.uint8), "L")
    if image.mode == mode:
        return image.copy()
    return image.convert(mode)


def augment_light(image: PILImage.Image, seed: int) -> PILImage.Image:
    """`--augment light` on one image: a random resized crop (80-100% of the area, aspect
    3:4..4:3; the model's processor resizes it) shifted by up to 5% of each side, drawn from
    `seed`. No flip: a mirrored digit or letter is another class, or none."""
    rng = np.random.default_rng(seed)
    width, height = image.size
    area = width * height
    crop_w, crop_h = width, height
    for _ in range(10):
        scale = rng.uniform(*CROP_SCALE)
        ratio = float(np.exp(rng.uniform(np.log(CROP_RATIO[0]), np.log(CROP_RATIO[1]))))
        w = round((area * scale * ratio) ** 0.5)
        h = round((area * scale / ratio) ** 0.5)
        if 0 < w <= width and 0 < h <= height:
            crop_w, crop_h = w, h
            break
    left = int(rng.integers(0, width - crop_w + 1)) + round(rng.uniform(-SHIFT, SHIFT) * width)
    top = int(rng.integers(0, height - crop_h + 1)) + round(rng.uniform(-SHIFT, SHIFT) * height)
    return image.crop((left, top, left + crop_w, top + crop_h))


def _size_text(path: Path) -> str:
    """'WxH pixels (N)' from the header alone, for the message about an oversized image."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    try:
        # Opening reads only the header; the limit is lifted just for that and restored.
        Image.MAX_IMAGE_PIXELS = None
        with Image.open(path) as image:
            width, height = image.size
    except Exception:  # the size is for the message only; the refusal stands without it
        return "too large"
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    return f"{width}x{height} pixels ({width * height:,})"
