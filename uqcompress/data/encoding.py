"""Encode examples for one model (tokenise or preprocess) and batch them for torch.

Images stay sources until a batch needs them: `collate` opens each image, applies
`--augment` and runs the model's image processor, in the data loader's worker processes
with `--workers N` (`make_loader`). Nothing holds a data set's pixels at once. Text is
tokenised once, in chunks, into one flat int32 array of token ids plus row offsets
(`TokenRows`): 4 bytes a token, where Python lists of ints cost about 36.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from uqcompress.data.dataset import LabeledData
from uqcompress.errors import ConfigError, DataError, empty_text_error

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from uqcompress.data.image_source import ImageSource
    from uqcompress.models.loading import LoadedModel


# Texts tokenised per call of the tokenizer: bounds the Python objects alive at once.
TOKENIZE_CHUNK = 4096


class TokenRows:
    """Rows of token ids (or token types) in one flat array with offsets: row i is
    `values[offsets[i]:offsets[i + 1]]`. Reads like a list of lists (`rows[i]`, slices,
    iteration, `==` against lists).

    Shape: values `[total tokens]`, offsets `[N + 1]`.
    """

    def __init__(self, values: npt.NDArray[Any], offsets: npt.NDArray[np.int64]) -> None:
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_chunks(cls, chunks: list[list[list[int]]], dtype: Any) -> TokenRows:
        rows = [row for chunk in chunks for row in chunk]
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((v for r in rows for v in r), dtype=dtype, count=int(offsets[-1]))
        return cls(values, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> npt.NDArray[Any]:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            return [self[i] for i in range(*key.indices(len(self)))]
        if key < 0:
            key += len(self)
        return [int(v) for v in self.row(key)]

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRows):
            return bool(
                np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.values, other.values)
            )
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass
class EncodedData:
    """Model-ready examples: image sources with the model's image processor (pixels made
    per batch), or token ids padded later per batch.

    `augment` (`none`/`light`) applies to shuffled (training) loaders only; `workers` is the
    number of data-loader worker processes. With `normalise` False image batches hold the
    processor's resized pixels on the 0..255 scale (what the ONNX Predictor takes).
    """

    input_kind: str
    labels: npt.NDArray[np.int64]
    images: ImageSource | None = None
    preprocessing: Any = None  # models.preprocessing.ImagePreprocessing
    normalise: bool = True
    augment: str = "none"
    workers: int = 0
    # in-memory images (built-in sets) without augmentation: their pixels, processed once
    pixel_cache: npt.NDArray[np.float32] | None = None
    input_ids: TokenRows | None = None
    pad_token_id: int = 0
    pad_left: bool = False  # the tokenizer pads on the left (decoders often do)
    truncated: int = 0
    # Text pairs for a family with token types (BERT, ELECTRA): the tokenizer's segment ids
    # (0 for the first text, 1 for the second); None: all zeros.
    token_type_ids: TokenRows | None = None

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


# The model config key where training records the token length it truncated to: what an
# export uses by default, so the deployed model reads what it was trained on.
MAX_LENGTH_KEY = "uqc_max_length"


def recorded_max_length(config: Any) -> int | None:
    """The token length a model was trained at (None: not recorded, e.g. an imported
    checkpoint or a model trained before uqc recorded it)."""
    value = getattr(config, MAX_LENGTH_KEY, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def record_max_length(config: Any, loaded: LoadedModel, max_length: int | None) -> None:
    """Record in a model config (before it is saved) the token length its training data were
    truncated to: `max_length`, or the model's limit when it was not given. Text only."""
    if loaded.input_kind != "text":
        return
    setattr(config, MAX_LENGTH_KEY, int(max_length or loaded.max_length or 512))


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
    *,
    augment: str = "none",
    workers: int = 0,
    check_pairs: bool = True,
) -> EncodedData:
    """Tokenise text with the model's tokenizer (truncating to `max_length`, default the
    model's limit; text pairs as the tokenizer's pair input, the longer text truncated first),
    or pair the images with the model's image processor (run per batch). With
    ``check_pairs`` (all but training data), data must be pairs exactly when the model was
    trained on pairs."""
    check_input_kind(data, loaded.input_kind, loaded.family.name)
    if loaded.input_kind == "image":
        assert loaded.preprocessing is not None
        return encode_images(
            data, loaded.preprocessing, label_ids, augment=augment, workers=workers
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
    want_types = pairs is not None and uses_token_types(loaded)
    id_chunks: list[list[list[int]]] = []
    type_chunks: list[list[list[int]]] = []
    truncated = 0
    for start in range(0, len(data.texts), TOKENIZE_CHUNK):
        texts = data.texts[start : start + TOKENIZE_CHUNK]
        pair = pairs[start : start + TOKENIZE_CHUNK] if pairs is not None else None
        tokens = loaded.tokenizer(texts, pair, truncation=False, add_special_tokens=True)
        ids = [list(map(int, row)) for row in tokens["input_ids"]]
        types = tokens.get("token_type_ids") if want_types else None
        kept_types = [list(map(int, row)) for row in types] if types is not None else None
        long = [i for i, row in enumerate(ids) if len(row) > max_length]
        truncated += len(long)
        if long:  # only these change under truncation (the longer text of a pair first)
            cut = loaded.tokenizer(
                [texts[i] for i in long],
                [pair[i] for i in long] if pair is not None else None,
                truncation=True,
                max_length=max_length,
            )
            for j, i in enumerate(long):
                ids[i] = list(map(int, cut["input_ids"][j]))
                if kept_types is not None and "token_type_ids" in cut:
                    kept_types[i] = list(map(int, cut["token_type_ids"][j]))
        id_chunks.append(ids)
        if kept_types is not None:
            type_chunks.append(kept_types)
    input_ids = TokenRows.from_chunks(id_chunks, np.int32)
    special = set(loaded.tokenizer.all_special_ids) - {loaded.tokenizer.unk_token_id}
    refuse_empty_texts(input_ids, sorted(special), data.spec)
    pad = loaded.tokenizer.pad_token_id
    return EncodedData(
        input_kind="text",
        labels=label_ids,
        input_ids=input_ids,
        pad_token_id=int(pad if pad is not None else 0),
        pad_left=getattr(loaded.tokenizer, "padding_side", "right") == "left",
        truncated=truncated,
        workers=workers,
        token_type_ids=TokenRows.from_chunks(type_chunks, np.int8) if type_chunks else None,
    )


def refuse_empty_texts(rows: TokenRows, special_ids: list[int], spec: str) -> None:
    """Refuse the first row of token ids with no token but the tokenizer's special ones
    (`special_ids`: its special tokens but the unknown one, which stands for real text).

    Shape: rows N rows of token ids (flat `[total tokens]` with offsets `[N + 1]`).
    """
    real = ~np.isin(rows.values, np.asarray(special_ids, dtype=rows.values.dtype))  # [total]
    counts = np.diff(np.concatenate([[0], np.cumsum(real, dtype=np.int64)])[rows.offsets])  # [N]
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        raise empty_text_error(f"{spec}: example {int(empty[0]) + 1} of {len(rows)}")


def encode_images(
    data: LabeledData,
    preprocessing: Any,
    label_ids: npt.NDArray[np.int64],
    *,
    normalise: bool = True,
    augment: str = "none",
    workers: int = 0,
) -> EncodedData:
    """Images with the image processor that makes their pixels, per batch (`collate`)."""
    from uqcompress.data.images import AUGMENTS

    if data.input_kind != "image" or data.images is None:
        raise DataError(f"{data.spec} holds {data.input_kind} examples, not images")
    if augment not in AUGMENTS:
        raise ConfigError(
            f"unknown --augment {augment!r}", hint=f"use one of: {', '.join(AUGMENTS)}"
        )
    from uqcompress.data.images import ArrayImages

    encoded = EncodedData(
        input_kind="image",
        labels=label_ids,
        images=data.images,
        preprocessing=preprocessing,
        normalise=normalise,
        augment=augment,
        workers=workers,
    )
    if isinstance(data.images, ArrayImages) and augment == "none":
        # Already in memory and small (a built-in set): the processor runs once, not per epoch.
        chunks = [
            _pixels(encoded, list(range(start, min(len(encoded), start + 256))))
            for start in range(0, len(encoded), 256)
        ]
        encoded.pixel_cache = np.concatenate(chunks) if chunks else None
    return encoded


class WorkerDataError(DataError):
    """A DataError raised in a data-loader worker process.

    torch re-raises a worker's exception in the main process as `type(exc)(text)`, `text`
    holding the worker's traceback; this class carries its message and hint in the last line
    of that text (after `MARK`, as JSON) and takes them back out, so the user still gets the
    one line naming the file.
    """

    MARK = "uqc-data-error:"

    def __init__(self, text: str) -> None:
        message, hint, self._marked = text, None, ""
        tail = text.rsplit(self.MARK, 1)
        if len(tail) == 2:
            with contextlib.suppress(ValueError, IndexError, TypeError):
                message, hint = json.loads(tail[1].strip().splitlines()[0])
        super().__init__(message, hint=hint)

    @classmethod
    def wrap(cls, exc: DataError) -> WorkerDataError:
        marked = cls.MARK + json.dumps([exc.message, exc.hint])
        wrapped = cls(marked)
        wrapped._marked = marked
        return wrapped

    def __str__(self) -> str:
        return self._marked or self.message


def collate(encoded: EncodedData, keys: list[Any]) -> dict[str, Any]:
    """Build one batch: images are opened, augmented (keys `(index, seed)` from a training
    loader with `--augment light`) and preprocessed here; text is padded to the longest
    example in the batch, on the side the tokenizer pads (right unless it says left).

    Shape: `pixel_values [B, C, H, W]`, or `input_ids`/`attention_mask`/`token_type_ids`
    `[B, T]`; `labels [B]`.
    """
    import torch

    indices = [k[0] if isinstance(k, tuple) else int(k) for k in keys]
    batch: dict[str, Any] = {"labels": torch.as_tensor(encoded.labels[indices])}
    if encoded.input_kind == "image":
        if encoded.pixel_cache is not None and not any(isinstance(k, tuple) for k in keys):
            batch["pixel_values"] = torch.from_numpy(encoded.pixel_cache[indices])
        else:
            batch["pixel_values"] = torch.from_numpy(_pixels(encoded, keys))
        return batch
    assert encoded.input_ids is not None
    rows = [encoded.input_ids.row(i) for i in indices]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), encoded.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    types = torch.zeros_like(ids)  # padding has type 0, as the tokenizer pads it
    for i, row in enumerate(rows):
        start = width - len(row) if encoded.pad_left else 0
        ids[i, start : start + len(row)] = torch.as_tensor(row)
        mask[i, start : start + len(row)] = 1
        if encoded.token_type_ids is not None:
            row_types = encoded.token_type_ids.row(indices[i])
            types[i, start : start + len(row)] = torch.from_numpy(row_types.astype(np.int64))
    batch["input_ids"] = ids
    batch["attention_mask"] = mask
    batch["token_type_ids"] = types
    return batch


def _pixels(encoded: EncodedData, keys: list[Any]) -> npt.NDArray[np.float32]:
    """Shape: B keys -> `[B, C, H, W]` float32 (normalised, or 0..255 without `normalise`)."""
    import torch.utils.data

    from uqcompress.data.image_source import model_mode
    from uqcompress.data.images import augment_light

    assert encoded.images is not None and encoded.preprocessing is not None
    prep = encoded.preprocessing
    mode = model_mode(prep.num_channels)
    try:
        images = []
        for key in keys:
            index, seed = key if isinstance(key, tuple) else (int(key), None)
            image = encoded.images.open(index, mode)
            images.append(image if seed is None else augment_light(image, seed))
        return prep.apply(images) if encoded.normalise else prep.resize(images)
    except DataError as exc:
        if torch.utils.data.get_worker_info() is None:
            raise
        raise WorkerDataError.wrap(exc) from None


class _Collate:
    """`collate` bound to its data, as an object (worker processes may need to pickle it)."""

    def __init__(self, encoded: EncodedData) -> None:
        self.encoded = encoded

    def __call__(self, keys: list[Any]) -> dict[str, Any]:
        return collate(self.encoded, keys)


class _Keys:
    """A map-style data set whose items are their keys (the work happens in `collate`)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: Any) -> Any:
        return key


def make_loader(
    encoded: EncodedData, batch_size: int, shuffle: bool = False, seed: int = 0
) -> DataLoader:
    """A torch DataLoader over the encoded examples, shuffled with its own seeded generator,
    collating in `encoded.workers` worker processes (0: in this process).

    The order and the augmentation draws depend only on `seed`, never on the number of
    workers: the generator is used exactly as with none, and each training example's
    augmentation seed is drawn with the order (`--augment light`).
    """
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    dataset: Any = _Keys(len(encoded))
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    sampler: Any = None
    if shuffle:
        augmenting = encoded.input_kind == "image" and encoded.augment != "none"
        kind = _seeded_sampler() if augmenting else RandomSampler
        sampler = kind(dataset, generator=generator)
    workers = max(0, int(encoded.workers))
    extra: dict[str, Any] = {}
    if workers > 0 and "fork" in multiprocessing.get_all_start_methods():
        extra["multiprocessing_context"] = "fork"  # workers start in milliseconds, not seconds
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        generator=generator,
        collate_fn=_Collate(encoded),
        num_workers=workers,
        **extra,
    )


@functools.cache
def _seeded_sampler() -> Any:
    """A RandomSampler whose keys are `(index, seed)`: one augmentation seed per example and
    epoch, drawn from the order's own generator after the order (the class is made on first
    use, so importing this module does not import torch; it stays in the main process)."""
    import torch
    from torch.utils.data import RandomSampler

    class SeededSampler(RandomSampler):
        def __iter__(self) -> Any:
            order = list(super().__iter__())
            draws = torch.randint(0, 2**31 - 1, (len(order),), generator=self.generator)
            return iter(list(zip(order, draws.tolist(), strict=True)))

    return SeededSampler


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch without labels, ready for `model(**inputs)`."""
    return {k: v for k, v in batch.items() if k != "labels"}
