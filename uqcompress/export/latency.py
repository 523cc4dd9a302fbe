"""The model-only latency an export measures of itself, for its model card.

Model only: the inputs are encoded (and a sampling model's noise drawn) before the clock
starts, so the number is ONNX Runtime's `session.run` per example, not tokenisation. It is
measured on the machine that exports, with the thread count and batch named beside it: a
deployment on other hardware measures its own.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any

import numpy as np

from uqcompress.export import contract

# At least MIN_RUNS timed runs, then more until BUDGET_SECONDS have passed, at most MAX_RUNS:
# a tiny model gets a steady median, a large one costs the export about a second.
MIN_RUNS = 3
MAX_RUNS = 20
BUDGET_SECONDS = 1.0
LATENCY_BATCH = 32  # examples per timed run (at most; fewer when the parity data has fewer)


def machine() -> str:
    """The exporting machine in one line: processor and logical CPUs."""
    processor = platform.processor() or platform.machine()
    return f"{processor}, {os.cpu_count()} logical CPUs, {platform.system()}"


def latency_inputs(predictor: Any, examples: Any) -> dict[str, Any]:
    """A batch of up to LATENCY_BATCH encoded inputs: the parity examples' texts (their
    lengths are the data's), or images of the model's size (content does not change the
    time of a classifier's pass).

    Shape: -> `[B, ...]`.
    """
    if predictor.input_kind == "text":
        texts = list(examples.texts[:LATENCY_BATCH])
        pairs = examples.text_pairs[:LATENCY_BATCH] if examples.text_pairs is not None else None
        return dict(predictor.encode_texts(texts, pairs))
    p = predictor.preprocessing
    size, channels = int(p["image_size"]), int(p["num_channels"])
    pixels = np.random.default_rng(0).integers(
        0, 256, (LATENCY_BATCH, channels, size, size), dtype=np.uint8
    )
    return dict(predictor.encode_pixels(pixels))


def measure_latency(predictor: Any, inputs: dict[str, Any], threads: int | None) -> dict[str, Any]:
    """Median ms per example of `predictor.run` on `inputs` (one batch), after one warm-up.

    Shape: inputs `[B, ...]` (the Predictor's encoded inputs).
    """
    if predictor.noise is not None and contract.NOISE_INPUT not in inputs:
        inputs = {**inputs, contract.NOISE_INPUT: predictor.draw_noise(inputs)}
    batch = int(next(iter(inputs.values())).shape[0])
    predictor.run(inputs)  # warm-up: ONNX Runtime plans memory on its first run
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < MAX_RUNS and (
        len(times) < MIN_RUNS or time.perf_counter() - started < BUDGET_SECONDS
    ):
        start = time.perf_counter()
        predictor.run(inputs)
        times.append(time.perf_counter() - start)
    shape = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, np.ndarray)}
    return {
        "ms_per_example": round(1000.0 * statistics.median(times) / batch, 4),
        "batch_size": batch,
        "input_shapes": shape,
        "runs": len(times),
        "threads": threads if threads is not None else "ONNX Runtime's default",
        "provider": predictor.session.get_providers()[0],
        "machine": machine(),
    }
