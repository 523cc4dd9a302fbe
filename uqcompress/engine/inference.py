"""Run a classifier over encoded data: logits and honest wall-clock timing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from uqcompress.data.encoding import EncodedData, make_loader, model_inputs

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Predictions:
    member_logits: npt.NDArray[np.float32]  # [N, M, C]
    seconds: float  # forward passes only, data collation excluded
    warmup_seconds: float = 0.0  # the untimed warm-up pass (`warmup=True`), not in `seconds`


def iter_logits(
    model: nn.Module,
    encoded: EncodedData,
    batch_size: int = 64,
    device: str = "cpu",
    warmup: bool = False,
) -> Iterator[tuple[npt.NDArray[np.float32], float, float]]:
    """Forward every example once in eval mode, batch by batch: each batch's member logits,
    the seconds its forward pass took (data collation excluded) and the seconds of a
    warm-up pass. With `warmup`, the first batch is run once untimed before its timed pass
    (as `OnnxSource` does), so the model time is that of a warm model on both backends.

    Shape: yields member logits `[B, M, C]` (M = 1 for a classifier).
    """
    import torch

    from uqcompress.models.outputs import member_logits
    from uqcompress.runtime.console import track

    model.eval()
    model.to(device)
    loader = make_loader(encoded, batch_size)
    for batch in track(loader, "predicting", total=len(loader)):
        # inference mode per batch, never held across a yield (the caller's code runs there)
        with torch.inference_mode():
            inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
            warm = 0.0
            if warmup:
                warm = time.perf_counter()
                member_logits(model, inputs)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                warm = time.perf_counter() - warm
                warmup = False
            start = time.perf_counter()
            logits = member_logits(model, inputs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            values = logits.float().cpu().numpy()
        yield values, seconds, warm


def predict_logits(
    model: nn.Module,
    encoded: EncodedData,
    batch_size: int = 64,
    device: str = "cpu",
    warmup: bool = False,
) -> Predictions:
    """Forward every example once in eval mode, filling one array allocated at the first
    batch (no per-batch copies kept and concatenated at the end).

    Shape: returns member logits `[N, M, C]` (M = 1 for a classifier).
    """
    result: npt.NDArray[np.float32] | None = None
    filled = 0
    seconds = warm = 0.0
    for values, spent, warmed in iter_logits(model, encoded, batch_size, device, warmup):
        seconds += spent
        warm += warmed
        if result is None:
            result = np.empty((len(encoded), *values.shape[1:]), dtype=np.float32)
        result[filled : filled + len(values)] = values
        filled += len(values)
    if result is None:
        result = np.empty((0, 1, 0), dtype=np.float32)
    return Predictions(member_logits=result, seconds=seconds, warmup_seconds=warm)
