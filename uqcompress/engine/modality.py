"""What differs between text and image models, in one place: a model's inputs by name, a
fixed batch of them to trace or count FLOPs on, the axes that vary, and raw synthetic examples
for the checks that steps run on what they build.

A family reads one modality (`Family.input_kind`); `modality_of(kind)` gives its object.
Everything that used to branch on `input_kind == "text"` to build inputs asks it instead: the
ONNX exporter's trace inputs and dynamic axes (`export/onnx.py`), the FLOP counter's input
(`engine/flops.py`), and the exactness checks of prune and fuse (`synthetic_batch`). The
torch-free Predictor has its own (numpy) preprocessing; it shares only the input names
(`export.contract.TEXT_INPUTS`/`IMAGE_INPUTS` are `TEXT.inputs`/`IMAGE.inputs`), so this
module imports torch only inside functions. In `engine/`, not `models/`: it encodes data
(`data.encoding`), which `models/` never imports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from uqcompress.data.dataset import LabeledData

# The length a model without a position table is traced and truncated at.
DEFAULT_MAX_LENGTH = 512


@dataclass(frozen=True)
class Modality(ABC):
    """One kind of input. `inputs`: the model's input names, in the exported graph's order
    (a sampling model's noise input comes after them)."""

    name: str
    inputs: tuple[str, ...]

    @abstractmethod
    def example_inputs(self, loaded: Any, batch: int, tokens: int) -> dict[str, torch.Tensor]:
        """A fixed batch of model inputs of `batch` examples (text: `tokens` tokens each):
        what the exporter traces and the FLOP counter runs. Values are seeded, so two calls
        give the same tensors.

        Shape: text ids, mask and token types `[batch, tokens]`; image pixels `[batch, C, S, S]`.
        """

    @abstractmethod
    def noise_tokens(self, model: Any, tokens: int) -> int:
        """The token count of a sampling model's noise for inputs of `tokens` tokens."""

    @abstractmethod
    def varying_axes(self, batch: Any, sequence: Any) -> tuple[dict[int, Any], dict[int, Any]]:
        """(the axes that vary in each model input, those of the noise input), given the
        batch and sequence dimensions to use for them."""

    @abstractmethod
    def synthetic_examples(
        self, loaded: Any, count: int, rng: np.random.Generator, pairs: bool
    ) -> LabeledData:
        """`count` raw examples of mixed size drawn with `rng` (text pairs when `pairs`)."""


@dataclass(frozen=True)
class TextModality(Modality):
    def example_inputs(self, loaded: Any, batch: int, tokens: int) -> dict[str, torch.Tensor]:
        import torch

        vocab = int(loaded.config.vocab_size)
        generator = torch.Generator().manual_seed(0)
        # ids from 5 on: the low ids are special tokens in every shipped vocabulary
        ids = torch.randint(5, vocab, (batch, tokens), generator=generator)
        return dict(
            zip(self.inputs, (ids, torch.ones_like(ids), torch.zeros_like(ids)), strict=True)
        )

    def noise_tokens(self, model: Any, tokens: int) -> int:
        return tokens

    def varying_axes(self, batch: Any, sequence: Any) -> tuple[dict[int, Any], dict[int, Any]]:
        return {0: batch, 1: sequence}, {0: batch, 3: sequence}  # noise: [B, S, K, T, d]

    def synthetic_examples(
        self, loaded: Any, count: int, rng: np.random.Generator, pairs: bool
    ) -> LabeledData:
        from uqcompress.data.dataset import LabeledData

        assert loaded.tokenizer is not None
        words = [w for w in loaded.tokenizer.get_vocab() if w.isalpha() and len(w) > 2]
        if not words:
            words = ["a", "b", "c"]
        lengths = [3, 17, 6, 30, 1, 11, 24, 2, 9, 40, 5, 14][:count]
        texts = [" ".join(rng.choice(words, size=n)) for n in lengths]
        return LabeledData(
            spec="synthetic",
            input_kind="text",
            texts=texts,
            labels=None,
            fingerprint="synthetic-text",
            text_pairs=texts[3:] + texts[:3] if pairs else None,
        )


@dataclass(frozen=True)
class ImageModality(Modality):
    def example_inputs(self, loaded: Any, batch: int, tokens: int) -> dict[str, torch.Tensor]:
        import torch

        size, channels = int(loaded.config.image_size), int(loaded.config.num_channels)
        return {self.inputs[0]: torch.zeros(batch, channels, size, size)}

    def noise_tokens(self, model: Any, tokens: int) -> int:
        return int(model.image_tokens())  # fixed by the image and patch sizes

    def varying_axes(self, batch: Any, sequence: Any) -> tuple[dict[int, Any], dict[int, Any]]:
        return {0: batch}, {0: batch}

    def synthetic_examples(
        self, loaded: Any, count: int, rng: np.random.Generator, pairs: bool
    ) -> LabeledData:
        from uqcompress.data.dataset import LabeledData
        from uqcompress.data.images import ArrayImages

        size, channels = int(loaded.config.image_size), int(loaded.config.num_channels)
        shape = (count, size, size) if channels == 1 else (count, size, size, 3)
        images = rng.integers(0, 256, size=shape).astype(np.uint8)  # the 0..255 scale
        return LabeledData(
            spec="synthetic",
            input_kind="image",
            images=ArrayImages(images),
            labels=None,
            fingerprint="synthetic-image",
        )


TEXT = TextModality("text", ("input_ids", "attention_mask", "token_type_ids"))
IMAGE = ImageModality("image", ("pixel_values",))
MODALITIES: dict[str, Modality] = {m.name: m for m in (TEXT, IMAGE)}


def modality_of(input_kind: str) -> Modality:
    """The modality of a family's (or a data set's) `input_kind`."""
    return MODALITIES[input_kind]


def synthetic_examples(
    loaded: Any, count: int = 12, seed: int = 1, pairs: bool | None = None
) -> LabeledData:
    """Raw examples when no --data is given: texts of mixed lengths (so batches pad) drawn
    from the tokenizer's vocabulary, or random images on the 0..255 scale. Text pairs (each
    text paired with another of the list) when ``pairs``, or, by default, when the model was
    trained on pairs."""
    from uqcompress.data.encoding import recorded_text_input

    if pairs is None:
        recorded = recorded_text_input(loaded.config)
        pairs = recorded is not None and bool(recorded["pair"])
    rng = np.random.default_rng(seed)
    return modality_of(loaded.input_kind).synthetic_examples(loaded, count, rng, pairs)


def synthetic_batch(loaded: Any, count: int = 6) -> dict[str, Any]:
    """A model-ready batch of `synthetic_examples` (padded texts or random images), for the
    exactness checks that steps run on what they build."""
    from uqcompress.data.encoding import collate, encode

    examples = synthetic_examples(loaded, count=count)
    encoded = encode(examples, loaded, np.zeros(len(examples), dtype=np.int64))
    return {k: v for k, v in collate(encoded, list(range(len(examples)))).items() if k != "labels"}
