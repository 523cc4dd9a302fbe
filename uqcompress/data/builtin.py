"""Data sets that ship inside installed packages (no download, ever).

`builtin:digits`: scikit-learn's 1,797 8x8 handwritten digits, 10 classes. Split once,
stratified by class, with seed 0: 70% `train`, 10% `val`, 20% `test` (1257 / 180 / 360).
Pixel values 0..16 are presented on the usual 0..255 scale (value * 255 / 16) as
`[N, 1, 8, 8]` float32, so the model's saved preprocessing is the standard one.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

from uqcompress.artifacts.hashing import sha256_bytes
from uqcompress.data.dataset import LabeledData

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
    images = (bunch.images[index].astype(np.float32) * np.float32(DIGITS_SCALE))[:, None, :, :]
    labels = bunch.target[index].astype(np.int64)
    fingerprint = sha256_bytes(
        b"digits\0" + np.ascontiguousarray(images).tobytes() + labels.tobytes()
    )[:32]
    return LabeledData(
        spec=f"builtin:digits@{split}",
        input_kind="image",
        images=images,
        labels=[int(v) for v in labels],
        label_names=[str(d) for d in range(10)],
        fingerprint=fingerprint,
    )
