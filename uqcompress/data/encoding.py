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
    # Text pairs for a family with token types (BERT, ELECTRA): the tokenizer's segment ids
    # (0 for the first text, 1 for the second); None: all zeros.
    token_type_ids: list[list[int]] | None = None

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


# The model config key where training records what text the model reads: single texts or
# pairs (and the columns it was trained on, for messages): {"pair": bool, "columns": [...]}.
TEXT_INPUT_KEY = "uqc_text_input"


def recorded_text_input(config: Any) -> dict[str, Any] | None:
    """What a model's training recorded about its text input (None: not recorded, e.g. an
    imported checkpoint or a model trained before uqc recorded it: any input is taken)."""
    recorded = getattr(config, TEXT_INPUT_KEY, None)
    return recorded if isinstance(recorded, dict) and "pair" in recorded else None


def record_text_input(config: Any, data: LabeledData) -> str | None:
    """Record in a model config (before it is saved) whether its training data were text
    pairs; returns a warning when that changes what the model was trained on before."""
    if data.input_kind != "text":
        return None
    pair = data.text_pairs is not None
    before = recorded_text_input(config)
    setattr(config, TEXT_INPUT_KEY, {"pair": pair, "columns": list(data.columns or [])})
    if before is not None and bool(before["pair"]) != pair:
        was, now = ("text pairs", "single texts") if before["pair"] else ("single texts", "pairs")
        return f"the model was trained on {was} before; it is now trained on {now} ({data.spec})"
    return None


def check_text_input(data: LabeledData, config: Any) -> None:
    """Data read as single texts for a model trained on pairs (or the reverse) fail in one
    line naming the columns to pass."""
    recorded = recorded_text_input(config)
    if recorded is None or data.input_kind != "text":
        return
    columns = [str(c) for c in recorded.get("columns") or []]
    if recorded["pair"] and data.text_pairs is None:
        shown = f" ({', '.join(columns)})" if len(columns) == 2 else ""
        flags = (
            f"--text-column {columns[0]} --text-pair-column {columns[1]}"
            if len(columns) == 2
            else "--text-pair-column COLUMN"
        )
        raise DataError(
            f"the model was fine-tuned on text pairs{shown}; {data.spec} is read as single texts",
            hint=f"pass the pair's columns: {flags}",
        )
    if not recorded["pair"] and data.text_pairs is not None:
        raise DataError(
            f"the model was fine-tuned on single texts; {data.spec} is read as text pairs "
            "(--text-pair-column)",
            hint="drop --text-pair-column (or fine-tune the model on pairs first)",
        )


def uses_token_types(loaded: LoadedModel) -> bool:
    """Whether the model tells a pair's two texts apart by token type (segment) ids: its
    embeddings have more than one type (BERT, ELECTRA; not RoBERTa, XLM-RoBERTa, DistilBERT
    or the decoders) and its tokenizer returns them."""
    types = int(getattr(loaded.config, "type_vocab_size", 0) or 0)
    names = getattr(loaded.tokenizer, "model_input_names", [])
    return types > 1 and "token_type_ids" in names


def encode(
    data: LabeledData,
    loaded: LoadedModel,
    label_ids: npt.NDArray[np.int64],
    max_length: int | None = None,
    check_pairs: bool = True,
) -> EncodedData:
    """Tokenise text with the model's tokenizer (truncating to `max_length`, default the
    model's limit; text pairs as the tokenizer's pair input, the longer text truncated first)
    or apply the model's saved image preprocessing. With ``check_pairs`` (all but training
    data), data must be pairs exactly when the model was trained on pairs."""
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
    if check_pairs:
        check_text_input(data, loaded.config)
    pairs = data.text_pairs
    full = loaded.tokenizer(data.texts, pairs, truncation=False, add_special_tokens=True)
    truncated = sum(1 for ids in full["input_ids"] if len(ids) > max_length)
    tokens = loaded.tokenizer(data.texts, pairs, truncation=True, max_length=max_length)
    ids = tokens["input_ids"]
    types = None
    if pairs is not None and uses_token_types(loaded) and "token_type_ids" in tokens:
        types = [list(map(int, row)) for row in tokens["token_type_ids"]]
    pad = loaded.tokenizer.pad_token_id
    return EncodedData(
        input_kind="text",
        labels=label_ids,
        input_ids=[list(map(int, row)) for row in ids],
        pad_token_id=int(pad if pad is not None else 0),
        pad_left=getattr(loaded.tokenizer, "padding_side", "right") == "left",
        truncated=truncated,
        token_type_ids=types,
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
    types = torch.zeros_like(ids)  # padding has type 0, as the tokenizer pads it
    for i, row in enumerate(rows):
        start = width - len(row) if encoded.pad_left else 0
        ids[i, start : start + len(row)] = torch.as_tensor(row)
        mask[i, start : start + len(row)] = 1
        if encoded.token_type_ids is not None:
            types[i, start : start + len(row)] = torch.as_tensor(encoded.token_type_ids[indices[i]])
    batch["input_ids"] = ids
    batch["attention_mask"] = mask
    batch["token_type_ids"] = types
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
