"""Encode examples for one model (tokenise or preprocess) and batch them for torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from uqcompress.data.dataset import LabeledData
from uqcompress.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from uqcompress.models.loading import LoadedModel


@dataclass
class EncodedData:
    """Model-ready examples: preprocessed pixels, or token ids padded later per batch."""

    input_kind: str
    labels: npt.NDArray[np.int64]
    pixel_values: npt.NDArray[np.float32] | None = None
    input_ids: list[list[int]] | None = None
    pad_token_id: int = 0
    pad_left: bool = False  # the tokenizer pads on the left (decoders often do)
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.labels)


def check_input_kind(data: LabeledData, input_kind: str, model_name: str) -> None:
    """Text data for an image model (or the reverse) fails before anything else is read."""
    if data.input_kind != input_kind:
        raise DataError(
            f"{data.spec} holds {data.input_kind} examples; the model ({model_name}) takes "
            f"{input_kind}",
            hint="pass data of the kind the model was built for",
        )


def encode(
    data: LabeledData,
    loaded: LoadedModel,
    label_ids: npt.NDArray[np.int64],
    max_length: int | None = None,
) -> EncodedData:
    """Tokenise text with the model's tokenizer (truncating to `max_length`, default the
    model's limit) or apply the model's saved image preprocessing."""
    check_input_kind(data, loaded.input_kind, loaded.family.name)
    if loaded.input_kind == "image":
        assert data.images is not None and loaded.preprocessing is not None
        return EncodedData(
            input_kind="image",
            labels=label_ids,
            pixel_values=loaded.preprocessing.apply(data.images),
        )
    assert data.texts is not None and loaded.tokenizer is not None
    limit = loaded.max_length or 512
    if max_length is None:
        max_length = limit
    if not 2 < max_length <= limit:
        raise ConfigError(
            f"--max-length {max_length} is outside 3..{limit} (the model's limit)",
            hint=f"pass --max-length between 3 and {limit}, or leave it out",
        )
    full = loaded.tokenizer(data.texts, truncation=False, add_special_tokens=True)["input_ids"]
    truncated = sum(1 for ids in full if len(ids) > max_length)
    ids = loaded.tokenizer(data.texts, truncation=True, max_length=max_length)["input_ids"]
    pad = loaded.tokenizer.pad_token_id
    return EncodedData(
        input_kind="text",
        labels=label_ids,
        input_ids=[list(map(int, row)) for row in ids],
        pad_token_id=int(pad if pad is not None else 0),
        pad_left=getattr(loaded.tokenizer, "padding_side", "right") == "left",
        truncated=truncated,
    )


def collate(encoded: EncodedData, indices: list[int]) -> dict[str, Any]:
    """Build one batch; text is padded to the longest example in the batch, on the side the
    tokenizer pads (right unless it says left).

    Shape: `pixel_values [B, C, H, W]`, or `input_ids`/`attention_mask`/`token_type_ids`
    `[B, T]`; `labels [B]`.
    """
    import torch

    batch: dict[str, Any] = {"labels": torch.as_tensor(encoded.labels[indices])}
    if encoded.input_kind == "image":
        assert encoded.pixel_values is not None
        batch["pixel_values"] = torch.from_numpy(encoded.pixel_values[indices])
        return batch
    assert encoded.input_ids is not None
    rows = [encoded.input_ids[i] for i in indices]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), encoded.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        start = width - len(row) if encoded.pad_left else 0
        ids[i, start : start + len(row)] = torch.as_tensor(row)
        mask[i, start : start + len(row)] = 1
    batch["input_ids"] = ids
    batch["attention_mask"] = mask
    batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def make_loader(
    encoded: EncodedData, batch_size: int, shuffle: bool = False, seed: int = 0
) -> DataLoader:
    """A torch DataLoader over the encoded examples (shuffled with its own seeded generator)."""
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator().manual_seed(seed) if shuffle else None
    indices: Any = list(range(len(encoded)))  # a list is a valid map-style dataset
    return DataLoader(
        indices,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        collate_fn=lambda indices: collate(encoded, indices),
    )


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch without labels, ready for `model(**inputs)`."""
    return {k: v for k, v in batch.items() if k != "labels"}
