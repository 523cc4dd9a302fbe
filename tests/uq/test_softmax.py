"""The one numpy softmax every numpy-side metric path uses."""

from __future__ import annotations

import numpy as np
import torch

from uqcompress.uq.metrics import softmax


def test_softmax_matches_torch_and_is_stable() -> None:
    logits = np.random.default_rng(0).normal(size=(5, 3, 7)) * 10
    expected = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
    np.testing.assert_allclose(softmax(logits), expected, rtol=0, atol=1e-12)
    huge = np.array([[1000.0, 1000.0, -1000.0]])
    np.testing.assert_allclose(softmax(huge), [[0.5, 0.5, 0.0]], atol=1e-12)
    assert softmax(huge).dtype == np.float64
