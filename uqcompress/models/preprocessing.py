"""Image preprocessing saved with a model as a ViTImageProcessor-style config.

Every image source in uqcompress yields pixel values on the usual 0..255 scale, as float32
`[N, C, H, W]` (scikit-learn's 0..16 digits are presented as value * 255 / 16). The model's
`preprocessor_config.json` then says how to turn them into its input: rescale, normalise.
Because the config is saved with the model, the ONNX runtime and every later step apply
exactly the preprocessing the model was trained with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.errors import DataError

PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class ImagePreprocessing:
    image_size: int
    num_channels: int
    rescale_factor: float = 1.0 / 255.0
    image_mean: tuple[float, ...] = (0.5,)
    image_std: tuple[float, ...] = (0.5,)

    @classmethod
    def default_for(cls, image_size: int, num_channels: int) -> ImagePreprocessing:
        return cls(
            image_size=image_size,
            num_channels=num_channels,
            image_mean=(0.5,) * num_channels,
            image_std=(0.5,) * num_channels,
        )

    def to_config(self) -> dict[str, Any]:
        """A config that `transformers.ViTImageProcessor.from_pretrained` also reads."""
        return {
            "image_processor_type": "ViTImageProcessor",
            "do_resize": False,
            "size": {"height": self.image_size, "width": self.image_size},
            "do_rescale": True,
            "rescale_factor": self.rescale_factor,
            "do_normalize": True,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "num_channels": self.num_channels,
        }

    def save(self, directory: Path) -> None:
        (directory / PREPROCESSOR_FILE).write_text(
            json.dumps(self.to_config(), indent=2) + "\n", encoding="utf-8"
        )

    @classmethod
    def load(cls, directory: Path, image_size: int, num_channels: int) -> ImagePreprocessing:
        """Read a saved config; a checkpoint without one gets the ViT default (mean=std=0.5)."""
        path = directory / PREPROCESSOR_FILE
        if not path.is_file():
            return cls.default_for(image_size, num_channels)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            from uqcompress.errors import ArtifactError

            raise ArtifactError(
                f"{path} is not a valid image-processor config ({exc})",
                hint="re-save it with the image processor's save_pretrained()",
            ) from exc
        mean = raw.get("image_mean", 0.5) if raw.get("do_normalize", True) else 0.0
        std = raw.get("image_std", 0.5) if raw.get("do_normalize", True) else 1.0
        mean_t = tuple(float(v) for v in (mean if isinstance(mean, list) else [mean]))
        std_t = tuple(float(v) for v in (std if isinstance(std, list) else [std]))
        if len(mean_t) == 1:
            mean_t, std_t = mean_t * num_channels, std_t * num_channels
        return cls(
            image_size=image_size,
            num_channels=num_channels,
            rescale_factor=float(raw.get("rescale_factor", 1 / 255))
            if raw.get("do_rescale", True)
            else 1.0,
            image_mean=mean_t,
            image_std=std_t,
        )

    def apply(self, pixels: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rescale and normalise pixel values on the 0..255 scale.

        Shape: pixels `[N, C, H, W]` -> `[N, C, H, W]` float32.
        """
        if pixels.ndim != 4:
            raise DataError(f"expected images as [N, C, H, W], got shape {pixels.shape}")
        pixels = match_channels(pixels, self.num_channels)
        _, channels, height, width = pixels.shape
        if channels != self.num_channels or (height, width) != (self.image_size,) * 2:
            raise DataError(
                f"images are {channels}x{height}x{width} (channels x height x width); the model "
                f"expects {self.num_channels}x{self.image_size}x{self.image_size}",
                hint="use data of the model's image size and channels, or a matching model",
            )
        mean = np.asarray(self.image_mean, dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(self.image_std, dtype=np.float32).reshape(1, -1, 1, 1)
        scaled = pixels.astype(np.float32) * np.float32(self.rescale_factor)
        return ((scaled - mean) / std).astype(np.float32)


# ITU-R 601-2 luma, the weights of PIL's convert("L").
_LUMA = np.asarray([0.299, 0.587, 0.114], dtype=np.float32).reshape(1, 3, 1, 1)


def match_channels(pixels: npt.NDArray[np.float32], channels: int) -> npt.NDArray[np.float32]:
    """Colour images for a grey model become luma; grey images for an RGB model repeat.

    Shape: `[N, C, H, W]` -> `[N, channels, H, W]` (other mismatches pass through unchanged).
    """
    have = pixels.shape[1]
    if have == 3 and channels == 1:
        return (pixels * _LUMA).sum(axis=1, keepdims=True).astype(np.float32)
    if have == 1 and channels == 3:
        return np.repeat(pixels, 3, axis=1)
    return pixels
