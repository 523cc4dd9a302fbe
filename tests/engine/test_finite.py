"""engine.finite: NaN and infinite weights counted exactly, in chunks (no copy of a tensor)."""

from __future__ import annotations

import math

import torch

from tests.process_memory import reset_peak, status
from uqcompress.engine import finite
from uqcompress.engine.finite import non_finite_weights, weights_summary


def test_every_non_finite_value_is_counted_across_chunks() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    big = torch.nn.Parameter(torch.zeros(finite.CHECK_CHUNK + 5))
    model.register_parameter("big", big)
    with torch.no_grad():
        model[0].weight[1, 2] = math.nan
        big[0], big[finite.CHECK_CHUNK - 1], big[finite.CHECK_CHUNK] = math.inf, -math.inf, math.nan
        big[-1] = math.nan
    count, names = non_finite_weights(model)
    assert count == 5
    assert names == ["big", "0.weight"]  # the model's order: its own parameters first
    assert (
        weights_summary(count, names) == "its weights hold 5 non-finite values (in big, 0.weight)"
    )
    assert non_finite_weights(torch.nn.Linear(3, 3)) == (0, [])


def test_the_check_makes_no_copy_of_a_large_tensor() -> None:
    """32M values (128 MiB): a whole-tensor check made a bool and an int64 copy (288 MiB);
    in chunks it holds one chunk's mask (1 MiB)."""
    warm = torch.nn.Module()  # the first check's one-time costs (kernels, thread pool)
    warm.weight = torch.nn.Parameter(torch.ones(finite.CHECK_CHUNK * 2))
    assert non_finite_weights(warm) == (0, [])
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.ones(1 << 25))
    reset_peak()
    start = status("VmRSS")
    assert non_finite_weights(model) == (0, [])
    assert status("VmHWM") - start < 16 * 2**20
