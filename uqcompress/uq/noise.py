"""Per-example noise for sampling models (DIRECTOR): the same input gets the same draws,
whatever batch it is scored in, in torch and in the torch-free ONNX Runtime Predictor.

The scheme (`NOISE_SCHEME`, part of every eval and calibrate id, so changing it changes ids):

- An example's key is the sha256 of a tag and its content: for text, its attended token ids
  and token type ids (int64 little-endian, in order; padding is never part of it); for an
  image, its model-ready `pixel_values` (float32 little-endian, C order).
- Its generator is NumPy's `Generator(PCG64(SeedSequence([seed, *digest words])))`, `seed`
  being the model's seed. NumPy, not torch: the Predictor must draw the same numbers
  without torch.
- Its draws are standard normal float32, step by step: step k draws `[S, T_i, d]` in C order
  (S samples, T_i the example's attended tokens, d hidden) and fills the attended positions.
  Padded positions get 0 (they are masked, so their value never reaches an attended token).

So the draws depend only on (seed, content): not on the batch size, the example's position
in the batch or the padded length. Only numpy here (the Predictor imports this module).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "AUTO_CHUNK_ROWS",
    "AUTO_CHUNK_TOKENS",
    "NOISE_SCHEME",
    "ExampleNoise",
    "draw_noise",
    "examples_per_pass",
]

NOISE_SCHEME = "example-pcg64-v1"
# Sampling models run their S samples in chunks: one pass holds at most this many tokens
# (sampled sequences x length) unless a sample chunk is given: S samples of 64 texts of 128
# tokens run 2 at a time, one text's S = 10 samples all at once. Torch (models/director_model)
# and the ONNX Predictor share it.
AUTO_CHUNK_TOKENS = 16384
# ... and at most this many sampled sequences, whatever their length: short sequences (an
# image student's 17 tokens) would otherwise fold all S x 64 = 640 into one pass, and on CPU
# 256 ran faster (S = 10 of a batch of 64 demo images: 4 samples per pass 0.62x of ten
# single-sample passes, all 10 at once 0.77x; benchmarks/director_cost.py --chunks --demo).
AUTO_CHUNK_ROWS = 256


def examples_per_pass(
    batch: int, samples: int, tokens: int, sample_chunk: int | None = None
) -> int:
    """How many of a batch's examples one pass of a graph that runs all S samples of each
    may take: about `sample_chunk` x `batch` sampled sequences (default: within
    AUTO_CHUNK_TOKENS tokens and AUTO_CHUNK_ROWS sequences), at least 1, at most `batch`."""
    if sample_chunk is not None:
        rows = max(1, sample_chunk) * batch
    else:
        rows = min(AUTO_CHUNK_ROWS, AUTO_CHUNK_TOKENS // max(1, tokens))
    return max(1, min(batch, rows // max(1, samples)))


_DIGEST_WORDS = 8  # the sha256 digest as 8 uint32 words of seed entropy


def _generator(seed: int, content: bytes) -> np.random.Generator:
    digest = hashlib.sha256(content).digest()
    words = np.frombuffer(digest, dtype="<u4")[:_DIGEST_WORDS]
    entropy = [int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF, *map(int, words)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def _examples(
    inputs: Mapping[str, npt.NDArray[Any]], tokens: int | None
) -> list[tuple[bytes, npt.NDArray[np.intp]]]:
    """(content key, attended positions) of each example.

    Shape: text inputs `[B, T]` (input_ids; attention_mask and token_type_ids optional), or
    pixel_values `[B, C, H, W]` (then `tokens` is the model's token count).
    """
    if "input_ids" in inputs:
        ids = np.asarray(inputs["input_ids"], dtype=np.int64)
        mask = np.asarray(inputs.get("attention_mask", np.ones_like(ids))) != 0
        types = np.asarray(inputs.get("token_type_ids", np.zeros_like(ids)), dtype=np.int64)
        found = []
        for row_ids, row_mask, row_types in zip(ids, mask, types, strict=True):
            content = (
                b"text\0"
                + row_ids[row_mask].astype("<i8").tobytes()
                + b"\0"
                + row_types[row_mask].astype("<i8").tobytes()
            )
            found.append((content, np.flatnonzero(row_mask)))
        return found
    if "pixel_values" in inputs:
        if tokens is None:
            raise ValueError("image inputs need the model's token count")
        pixels = np.ascontiguousarray(np.asarray(inputs["pixel_values"], dtype="<f4"))
        positions = np.arange(tokens)
        return [(b"image\0" + row.tobytes(), positions) for row in pixels]
    raise ValueError(f"no input_ids or pixel_values among {sorted(inputs)}")


class ExampleNoise:
    """A batch's draws, one step at a time (only one step's noise in memory).

    Shape: each `step()` is `[B, S, T, d]` float32, T the padded length (text) or `tokens`.
    """

    def __init__(
        self,
        inputs: Mapping[str, npt.NDArray[Any]],
        seed: int,
        samples: int,
        hidden: int,
        tokens: int | None = None,
    ) -> None:
        examples = _examples(inputs, tokens)
        first = np.asarray(next(iter(inputs.values())))
        self.shape = (
            len(examples),
            samples,
            tokens if tokens is not None else int(first.shape[1]),
            hidden,
        )
        self._streams = [(_generator(seed, content), pos) for content, pos in examples]

    def step(self) -> npt.NDArray[np.float32]:
        _, samples, _, hidden = self.shape
        out = np.zeros(self.shape, dtype=np.float32)
        for b, (generator, positions) in enumerate(self._streams):
            draw = generator.standard_normal((samples, len(positions), hidden), dtype=np.float32)
            out[b][:, positions] = draw
        return out


def draw_noise(
    inputs: Mapping[str, npt.NDArray[Any]],
    seed: int,
    samples: int,
    steps: int,
    hidden: int,
    tokens: int | None = None,
) -> npt.NDArray[np.float32]:
    """Every step's draws at once, for a graph that takes its noise as an input: the same
    numbers as `ExampleNoise` gives step by step.

    Shape: `[B, S, K, T, d]` float32 (K = steps).
    """
    stream = ExampleNoise(inputs, seed, samples, hidden, tokens)
    batch, _, length, _ = stream.shape
    out = np.zeros((batch, samples, steps, length, hidden), dtype=np.float32)
    for b, (generator, positions) in enumerate(stream._streams):
        # One call for the K steps draws the same sequence as K calls of [S, T_i, d].
        draw = generator.standard_normal((steps, samples, len(positions), hidden), np.float32)
        out[b][:, :, positions] = draw.transpose(1, 0, 2, 3)  # [S, K, T_i, d]
    return out
