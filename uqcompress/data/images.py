"""Image folders: `DIR/<class>/*.png|jpg` (labelled) or `DIR/*.png|jpg` (unlabelled).

Images are read with PIL into `[N, C, H, W]` float32 on the 0..255 scale, the same scale as
every other image source, so the model's saved preprocessing applies unchanged: 8-bit grey
stays one channel, anything with colour becomes RGB, 16-bit grey is rescaled to 0..255.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts.hashing import sha256_bytes, sha256_file
from uqcompress.data.dataset import LabeledData
from uqcompress.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_GREY_MODES = ("1", "L", "I;16", "I;16B", "I;16L", "I")


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def load_image_folder(root: Path, require_labels: bool = True) -> LabeledData:
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
        raise DataError(f"{root} holds no .png/.jpg images in class folders", hint=hint)
    pixels = [_read(path) for path in files]
    grey = all(p.ndim == 2 for p in pixels)
    arrays = [p if grey else _as_rgb(p) for p in pixels]
    shape = arrays[0].shape
    for path, array in zip(files, arrays, strict=True):
        if array.shape != shape:
            raise DataError(
                f"{path} is {array.shape[1]}x{array.shape[0]} pixels; {files[0].name} is "
                f"{shape[1]}x{shape[0]}: a folder's images must share one size",
                hint="resize the images to the model's input size",
            )
    stacked = np.stack(arrays).astype(np.float32)
    images = stacked[:, None] if grey else stacked.transpose(0, 3, 1, 2)  # -> [N, C, H, W]
    digest = "\n".join(f"{p.relative_to(root).as_posix()}\0{sha256_file(p)}" for p in files)
    return LabeledData(
        spec=str(root),
        input_kind="image",
        images=np.ascontiguousarray(images),
        labels=labels or None,
        fingerprint=sha256_bytes(b"image-folder\0" + digest.encode())[:32],
    )


def _read(path: Path) -> npt.NDArray[np.float32]:
    """One image as `[H, W]` (grey) or `[H, W, 3]` (colour) on the 0..255 scale."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        # Above Image.MAX_IMAGE_PIXELS PIL only warns (above twice that it raises); either way
        # such a file would cost gigabytes as float32 pixels, far beyond any classifier input.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return _decode(path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise DataError(
            f"image {path} is {_size_text(path)}, more than the {Image.MAX_IMAGE_PIXELS:,} "
            "pixels uqc reads from one image (a possible decompression bomb)",
            hint="resize the image to the model's input size, or remove it",
        ) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(
            f"cannot read image {path} ({exc})", hint="replace or remove the damaged file"
        ) from exc


def _decode(path: Path) -> npt.NDArray[np.float32]:
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        mode = image.mode
        if mode in _GREY_MODES:
            array = np.asarray(image.convert("I") if mode != "L" else image, np.float32)
            if mode.startswith("I;16") or mode == "I":
                array = array * np.float32(255.0 / 65535.0)
            elif mode == "1":
                array = array * np.float32(255.0)
            return array
        return np.asarray(image.convert("RGB"), dtype=np.float32)


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


def _as_rgb(array: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return np.repeat(array[..., None], 3, axis=-1) if array.ndim == 2 else array
