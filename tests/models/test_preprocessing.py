"""`models.preprocessing.plain_resize`: which image-processor configs code without
transformers can reproduce as one PIL resize, and that the resize it names is the
processor's own, pixel for pixel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from uqcompress.models.preprocessing import (
    ImagePreprocessing,
    default_processor_config,
    plain_resize,
)


def test_uqcs_own_processor_config_is_a_plain_bilinear_resize() -> None:
    assert plain_resize(default_processor_config(16, 3), 3) == (16, 16, 2)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"do_center_crop": True, "crop_size": {"height": 8, "width": 8}}, "crops"),
        ({"size": {"shortest_edge": 16}}, "keeps the aspect ratio"),
        ({"do_resize": False}, "does not resize"),
        ({"image_processor_type": "ConvNextImageProcessor"}, "another processor"),
        ({"resample": 9}, "not a PIL filter"),
        ({"image_mean": [0.5, 0.5]}, "a mean per channel it does not have"),
    ],
)
def test_configs_that_are_not_one_fixed_resize_are_not_reproduced(
    change: dict[str, Any], why: str
) -> None:
    config = {**default_processor_config(16, 3), **change}
    assert plain_resize(config, 3) is None, why


def test_the_named_resize_equals_the_processors_own() -> None:
    from PIL import Image

    config = {**default_processor_config(12, 3), "resample": 3}  # bicubic
    height, width, resample = plain_resize(config, 3) or (0, 0, 0)
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 256, size=shape).astype(np.uint8), "RGB")
        for shape in [(30, 7, 3), (12, 12, 3), (5, 40, 3)]
    ]
    want = ImagePreprocessing.from_config(config, 12, 3).resize(images)
    got = np.stack(
        [
            np.asarray(image.resize((width, height), resample=resample), np.float32)
            for image in images
        ]
    ).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, want)
