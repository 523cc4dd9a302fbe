"""Entropy and mutual information have one definition (uq/functional.py): torch, its numpy
twin in uq.metrics and the exported ONNX graph agree within 1e-6 (issue 14, item 20)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from uqcompress.uq import metrics as m
from uqcompress.uq.functional import as_deployed, uncertainty_outputs

TOL = 1e-6


def _cases() -> list[np.ndarray]:
    """Member logits `[B, M, C]`: random, near-one-hot, uniform, members that disagree
    confidently, and mixtures of these, for several M and C."""
    rng = np.random.default_rng(0)
    cases = []
    for members, classes in [(1, 2), (3, 2), (5, 10), (8, 7), (2, 50)]:
        random = rng.normal(size=(16, members, classes)) * 3
        one_hot = rng.normal(size=(8, members, classes)) * 60  # softmax ~ one-hot, tiny tails
        uniform = np.zeros((4, members, classes)) + rng.normal(size=(4, members, 1))
        near_uniform = rng.normal(size=(4, members, classes)) * 1e-4
        cases.append(np.concatenate([random, one_hot, uniform, near_uniform]).astype(np.float32))
    disagree = np.full((2, 2, 3), -40.0, dtype=np.float32)
    disagree[:, 0, 0] = disagree[:, 1, 1] = 40.0  # two sure members, different classes: ln 2
    cases.append(disagree)
    return cases


def _numpy(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    member_probs = m.softmax(logits)
    probs = member_probs.mean(axis=1)
    return probs, m.predictive_entropy(probs), m.member_mutual_information(member_probs)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torch_numpy_and_onnx_agree_on_entropy_and_mutual_information(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from uqcompress.export.graph import _outputs

    class Head(torch.nn.Module):  # the exported graphs' own tail
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _outputs(x)[1:4]  # probs, entropy, mutual_info

    path = tmp_path / "head.onnx"
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("members"), 2: torch.export.Dim("c")}
    torch.onnx.export(
        Head().eval(), (torch.randn(3, 2, 4),), str(path), dynamo=True, dynamic_shapes=(dims,)
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for logits in _cases():
        with torch.no_grad():
            torch_out = [t.numpy() for t in uncertainty_outputs(torch.from_numpy(logits))]
        onnx_out = session.run(None, {session.get_inputs()[0].name: logits})
        for name, t, n, o in zip(
            ("probs", "entropy", "mi"), torch_out, _numpy(logits), onnx_out, strict=True
        ):
            assert t.dtype == np.float32 and o.dtype == np.float32
            assert np.abs(t - n).max() <= TOL, (name, logits.shape)
            assert np.abs(t - o).max() <= TOL, (name, logits.shape)
        assert (torch_out[2] >= 0).all()
    ln2 = _numpy(_cases()[-1])[2]
    assert np.allclose(ln2, np.log(2), atol=TOL)


def test_the_numpy_twin_is_zero_for_one_member_and_for_agreeing_members() -> None:
    rng = np.random.default_rng(1)
    probs = m.softmax(rng.normal(size=(5, 1, 4)))
    assert np.array_equal(m.member_mutual_information(probs), np.zeros(5))
    agreeing = np.repeat(m.softmax(rng.normal(size=(5, 1, 4))), 3, axis=1)
    assert np.abs(m.member_mutual_information(agreeing)).max() <= 1e-15  # no cancellation


def test_as_deployed_is_the_graphs_float32_computation() -> None:
    logits = _cases()[2]
    deployed = as_deployed(logits)
    with torch.no_grad():
        graph = [t.numpy() for t in uncertainty_outputs(torch.from_numpy(logits))]
    for got, want in zip(deployed, graph, strict=True):
        assert got.dtype == np.float32 and np.array_equal(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_and_numpy_auroc_agree_with_sklearn_with_ties(seed: int) -> None:
    """One AUROC per array library: the torch twin (circuit search) and the numpy metric
    (eval) give sklearn's value, ties included (scores rounded to force them)."""
    from sklearn.metrics import roc_auc_score

    from uqcompress.uq.functional import auroc
    from uqcompress.uq.metrics import ood_detection

    rng = np.random.default_rng(seed)
    s_in = np.round(rng.normal(0.0, 1.0, 200), 1)
    s_out = np.round(rng.normal(0.7, 1.0, 150), 1)
    expected = roc_auc_score(np.r_[np.zeros(200), np.ones(150)], np.r_[s_in, s_out])
    assert auroc(torch.from_numpy(s_in), torch.from_numpy(s_out)) == pytest.approx(expected)
    assert ood_detection(s_in, s_out)["auroc"] == pytest.approx(expected)
