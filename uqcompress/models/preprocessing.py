"""Image preprocessing saved with a model: its transformers image processor.

A model's `preprocessor_config.json` (what `save_pretrained` writes, and what uqc writes for
the models it creates) names a transformers image processor and its settings: resize, crop,
rescale, normalise. Every image goes through that processor (its PIL backend, so results do
not depend on whether torchvision is installed): it resizes and crops each image, of any
size, to the model's input. Rescale and normalise then run in float32 with the processor's
own `rescale_factor`, `image_mean` and `image_std`, exactly as the exported ONNX Predictor
runs them (the processor's numpy path rescales in float64 first; the two agree within one
float32 unit in the last place, 1.2e-7 on normalised values).

Because the config is saved with the model, the ONNX runtime and every later step apply
exactly the preprocessing the model was trained with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from uqcompress.errors import ArtifactError, DataError

PREPROCESSOR_FILE = "preprocessor_config.json"
BILINEAR = 2  # PIL.Image.Resampling.BILINEAR, ViT's default


def default_processor_config(
    image_size: int,
    num_channels: int,
    rescale_factor: float = 1.0 / 255.0,
    image_mean: tuple[float, ...] | None = None,
    image_std: tuple[float, ...] | None = None,
) -> dict[str, Any]:
    """A `ViTImageProcessor` config: resize (bilinear) to the model's size, rescale, normalise
    (mean = std = 0.5 per channel unless given)."""
    return {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": True,
        "size": {"height": image_size, "width": image_size},
        "resample": BILINEAR,
        "do_rescale": True,
        "rescale_factor": rescale_factor,
        "do_normalize": True,
        "image_mean": list(image_mean or (0.5,) * num_channels),
        "image_std": list(image_std or (0.5,) * num_channels),
        "num_channels": num_channels,
    }


# A resize or crop side beyond this is no model's input (and would allocate gigabytes).
MAX_SIDE = 8192
_SIZE_KEYS = ("height", "width", "shortest_edge", "longest_edge")
_FLAGS = ("do_resize", "do_rescale", "do_normalize", "do_center_crop", "do_convert_rgb")


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and bool(np.isfinite(float(value)))
    )


def _side_problem(key: str, value: Any) -> str | None:
    """What is wrong with a `size` / `crop_size` value (None: a usable one)."""
    if isinstance(value, dict):
        sides = {k: v for k, v in value.items() if k in _SIZE_KEYS and v is not None}
        if not sides:
            return f"{key} {value!r} names no height/width or shortest_edge"
        for name, side in sides.items():
            problem = _side_problem(f"{key}.{name}", side)
            if problem is not None:
                return problem
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{key} is {value!r}, not a whole number of pixels"
    if not 1 <= value <= MAX_SIDE:
        return f"{key} is {value}; a side must be 1..{MAX_SIDE} pixels"
    return None


def processor_config_problem(raw: dict[str, Any], num_channels: int) -> str | None:
    """The first value of an image-processor config that cannot work (None: none): a resize
    or crop side that is not 1..MAX_SIDE pixels (a negative resize failed in PIL with a
    traceback, after `uqc import` had accepted the config), a rescale factor that is not a
    positive number, a mean or std that is not one number per channel (std nonzero), a
    resampling filter PIL does not have, a flag that is not true/false."""
    for flag in _FLAGS:
        if flag in raw and not isinstance(raw[flag], bool):
            return f"{flag} is {raw[flag]!r}, not true or false"
    if raw.get("do_resize", True) and "size" in raw:
        problem = _side_problem("size", raw["size"])
        if problem is not None:
            return problem
    if raw.get("do_center_crop", False) and "crop_size" in raw:
        problem = _side_problem("crop_size", raw["crop_size"])
        if problem is not None:
            return problem
    if "resample" in raw and not (
        isinstance(raw["resample"], int)
        and not isinstance(raw["resample"], bool)
        and 0 <= raw["resample"] <= 5
    ):
        return f"resample is {raw['resample']!r}, not a PIL filter number (0..5)"
    if raw.get("do_rescale", True) and "rescale_factor" in raw:
        factor = raw["rescale_factor"]
        if not (_number(factor) and float(factor) > 0):
            return f"rescale_factor is {factor!r}, not a positive number"
    if raw.get("do_normalize", True):
        for key in ("image_mean", "image_std"):
            if key not in raw:
                continue
            value = raw[key]
            values = value if isinstance(value, list) else [value]
            if not values or not all(_number(v) for v in values):
                return f"{key} is {value!r}, not a number or a list of numbers"
            if len(values) not in (1, num_channels):
                return (
                    f"{key} has {len(values)} values; the model has {num_channels} channel"
                    f"{'s' if num_channels != 1 else ''}"
                )
            if key == "image_std" and any(float(v) == 0 for v in values):
                return f"image_std {value!r} has a zero (normalising would divide by it)"
    return None


# The processors whose whole work before rescale is a PIL resize to a fixed height x width
# (`size: {height, width}`, no crop): ViT's, which uqc writes for the models it creates.
_PLAIN_RESIZE_PROCESSORS = ("ViTImageProcessor", "ViTImageProcessorFast", "ViTImageProcessorPil")


def plain_resize(raw: Any, num_channels: int) -> tuple[int, int, int] | None:
    """`(height, width, resample)` when the processor config `raw` only resizes each image
    with PIL to a fixed height x width before rescaling (what `ViTImageProcessor` does: PIL's
    `Image.resize((width, height), resample)`), so code without transformers can reproduce it
    exactly; None when it resizes by the shortest edge, crops, does not resize, or is another
    processor (those images must come at the model's size).
    """
    if not isinstance(raw, dict) or processor_config_problem(raw, num_channels) is not None:
        return None
    if raw.get("image_processor_type", "ViTImageProcessor") not in _PLAIN_RESIZE_PROCESSORS:
        return None
    size = raw.get("size")
    if not raw.get("do_resize", True) or raw.get("do_center_crop", False):
        return None
    if not isinstance(size, dict) or not {"height", "width"} <= size.keys():
        return None
    return int(size["height"]), int(size["width"]), int(raw.get("resample", BILINEAR))


@dataclass(frozen=True)
class ImagePreprocessing:
    """The model's image processor config and the numbers the Predictor needs from it.

    `processor_json` is the saved config (canonical JSON), so the object stays hashable and
    cheap to send to data-loader worker processes; the processor is built from it on first use.
    """

    image_size: int
    num_channels: int
    rescale_factor: float = 1.0 / 255.0
    image_mean: tuple[float, ...] = (0.5,)
    image_std: tuple[float, ...] = (0.5,)
    processor_json: str = field(default="", compare=False)

    @classmethod
    def default_for(cls, image_size: int, num_channels: int) -> ImagePreprocessing:
        return cls.from_config(
            default_processor_config(image_size, num_channels), image_size, num_channels
        )

    @classmethod
    def from_config(
        cls, raw: dict[str, Any], image_size: int, num_channels: int
    ) -> ImagePreprocessing:
        """Read a processor config; rescale and normalise default to ViT's (1/255, 0.5)."""
        normalise = bool(raw.get("do_normalize", True))
        mean = raw.get("image_mean", 0.5) if normalise else 0.0
        std = raw.get("image_std", 0.5) if normalise else 1.0
        mean_t = tuple(float(v) for v in (mean if isinstance(mean, list) else [mean]))
        std_t = tuple(float(v) for v in (std if isinstance(std, list) else [std]))
        if len(mean_t) == 1:
            mean_t, std_t = mean_t * num_channels, std_t * num_channels
        rescale = float(raw.get("rescale_factor", 1 / 255)) if raw.get("do_rescale", True) else 1.0
        return cls(
            image_size=image_size,
            num_channels=num_channels,
            rescale_factor=rescale,
            image_mean=mean_t,
            image_std=std_t,
            processor_json=json.dumps(raw, sort_keys=True),
        )

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> ImagePreprocessing:
        """From the `uqc.preprocessing` metadata of an ONNX export; exports written before the
        processor config was recorded there get the default (resize to the model's size)."""
        size, channels = int(meta["image_size"]), int(meta["num_channels"])
        raw = meta.get("processor")
        if not isinstance(raw, dict):
            raw = default_processor_config(
                size,
                channels,
                float(meta["rescale_factor"]),
                tuple(meta["image_mean"]),
                tuple(meta["image_std"]),
            )
        return cls.from_config(raw, size, channels)

    def to_config(self) -> dict[str, Any]:
        """The processor config, as saved (`transformers.AutoImageProcessor` reads it too)."""
        if self.processor_json:
            config: dict[str, Any] = json.loads(self.processor_json)
            return config
        return default_processor_config(
            self.image_size, self.num_channels, self.rescale_factor, self.image_mean, self.image_std
        )

    def save(self, directory: Path) -> None:
        (directory / PREPROCESSOR_FILE).write_text(
            json.dumps(self.to_config(), indent=2) + "\n", encoding="utf-8"
        )

    @classmethod
    def load(cls, directory: Path, image_size: int, num_channels: int) -> ImagePreprocessing:
        """Read a saved config; a checkpoint without one gets the ViT default (resize to the
        model's size, mean = std = 0.5)."""
        path = directory / PREPROCESSOR_FILE
        if not path.is_file():
            return cls.default_for(image_size, num_channels)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ArtifactError(
                f"{path} is not a valid image-processor config ({exc})",
                hint="re-save it with the image processor's save_pretrained()",
            ) from exc
        problem = processor_config_problem(raw, num_channels)
        if problem is not None:
            raise ArtifactError(
                f"{path} is not a valid image-processor config: {problem}",
                hint="fix the value (or re-save the config with the image processor's "
                "save_pretrained())",
            )
        prep = cls.from_config(raw, image_size, num_channels)
        prep.processor  # noqa: B018 (an unknown processor type fails when the model loads)
        return prep

    @cached_property
    def processor(self) -> Any:
        """The transformers image processor (PIL backend) this config names."""
        from transformers.models.auto.image_processing_auto import (
            get_image_processor_class_from_name,
        )

        config = self.to_config()
        name = str(config.get("image_processor_type") or "ViTImageProcessor")
        base = name.removesuffix("Fast").removesuffix("Pil")
        cls = get_image_processor_class_from_name(base + "Pil")
        if cls is None:
            raise ArtifactError(
                f"the image processor {name!r} in {PREPROCESSOR_FILE} is not one transformers "
                "has a PIL implementation of",
                hint="save the model with a standard image processor (e.g. ViTImageProcessor)",
            )
        kwargs = {k: v for k, v in config.items() if k != "image_processor_type"}
        return cls(**kwargs)

    def resize(self, images: list[Any]) -> npt.NDArray[np.float32]:
        """The processor's resize and crop, without rescale or normalise: pixels of the
        model's size on the 0..255 scale. Images must already be in the model's mode
        (`L` for one channel, `RGB` for three).

        Shape: B PIL images of any sizes -> `[B, C, H, W]` float32.
        """
        # The images come in the model's mode already: a processor that converts to RGB
        # (BitImageProcessor's do_convert_rgb) must not make a grey model's input colour.
        options = {"do_rescale": False, "do_normalize": False, "do_convert_rgb": False}
        out = self.processor(images, return_tensors="np", **options)["pixel_values"]
        pixels = np.asarray(out, dtype=np.float32)
        want = (self.num_channels, self.image_size, self.image_size)
        if pixels.ndim != 4 or pixels.shape[1:] != want:
            got = "x".join(map(str, pixels.shape[1:]))
            raise DataError(
                f"the model's image processor turned the images into {got} (channels x height "
                f"x width); the model expects {'x'.join(map(str, want))}",
                hint="pass images of the model's size, or give the model a "
                "preprocessor_config.json that resizes (do_resize true, size: its image_size)",
            )
        return pixels

    def normalise(self, pixels: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Rescale and normalise pixel values on the 0..255 scale, in float32.

        Shape: pixels `[N, C, H, W]` -> `[N, C, H, W]` float32.
        """
        if pixels.ndim != 4:
            raise DataError(f"expected images as [N, C, H, W], got shape {pixels.shape}")
        mean = np.asarray(self.image_mean, dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.asarray(self.image_std, dtype=np.float32).reshape(1, -1, 1, 1)
        # In place on one float32 copy (a batch of 224 px images is 600 KB per image): the
        # same float32 operations, in the same order, as the Predictor's.
        out = np.array(pixels, dtype=np.float32, copy=True)
        out *= np.float32(self.rescale_factor)
        out -= mean
        out /= std
        return out

    def apply(self, images: list[Any]) -> npt.NDArray[np.float32]:
        """The model's input for a batch of images: `resize`, then `normalise`.

        Shape: B PIL images -> pixel_values `[B, C, H, W]` float32.
        """
        return self.normalise(self.resize(images))

    def __getstate__(self) -> dict[str, Any]:  # the built processor is not sent to workers
        state = dict(self.__dict__)
        state.pop("processor", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


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
