"""What a data set holds of its images: N of them, each opened on demand (`ImageSource`).

A leaf of `data/`: `dataset.LabeledData` names the type and `data/images.py` implements it
(arrays, files, folders), so neither imports the other back. The concrete sources are in
`data/images.py`; `ConcatImages` is here because every source can concatenate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from PIL import Image as PILImage


def model_mode(channels: int) -> str:
    """The PIL mode images are converted to for a model of `channels` channels."""
    return "L" if channels == 1 else "RGB"


class ImageSource(ABC):
    """N images, each opened on demand as a PIL image in a given mode."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def open(self, index: int, mode: str) -> PILImage.Image:
        """Image `index` in `mode` (`L` or `RGB`); a DataError names it if it cannot be read."""

    @abstractmethod
    def subset(self, indices: Sequence[int]) -> ImageSource: ...

    def concat(self, other: ImageSource) -> ImageSource:
        return ConcatImages([self, other])

    def as_pixels(self, channels: int) -> npt.NDArray[np.float32]:
        """Every image, unresized, stacked (they must share one size): for small sets only.

        Shape: `[N, channels, H, W]` float32 on the 0..255 scale.
        """
        mode = model_mode(channels)
        arrays = [np.asarray(self.open(i, mode), dtype=np.float32) for i in range(len(self))]
        stacked = np.stack(arrays)
        return stacked[:, None] if channels == 1 else stacked.transpose(0, 3, 1, 2)


class ConcatImages(ImageSource):
    def __init__(self, parts: list[ImageSource]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def _locate(self, index: int) -> tuple[ImageSource, int]:
        for part in self.parts:
            if index < len(part):
                return part, index
            index -= len(part)
        raise IndexError(index)

    def open(self, index: int, mode: str) -> PILImage.Image:
        part, local = self._locate(index)
        return part.open(local, mode)

    def subset(self, indices: Sequence[int]) -> ImageSource:
        pairs = [self._locate(i) for i in indices]
        return ConcatImages([p.subset([i]) for p, i in pairs])
