"""Analytic checks for uqcompress.uq.functional."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from uqcompress.uq.functional import (
    UncertaintyOutputs,
    entropy,
    mean_probs,
    mutual_information,
    uncertainty_outputs,
)


def _np_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _np_entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


@pytest.mark.parametrize("num_classes", [2, 3, 10, 1000])
def test_entropy_of_uniform_is_log_c(num_classes: int) -> None:
    probs = torch.full((4, num_classes), 1.0 / num_classes)
    h = entropy(probs)
    assert h.shape == (4,)
    torch.testing.assert_close(h, torch.full((4,), math.log(num_classes)), atol=1e-5, rtol=1e-6)


def test_entropy_of_one_hot_is_exactly_zero() -> None:
    probs = torch.eye(5)
    h = entropy(probs)
    assert torch.equal(h, torch.zeros(5))
    assert not torch.isnan(h).any()


def test_entropy_respects_dim_and_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), size=(3, 4))  # [3, 4, 6]
    p_t = torch.from_numpy(p)
    expected = _np_entropy(p)
    np.testing.assert_allclose(entropy(p_t).numpy(), expected, rtol=1e-12)
    # Same distributions with the class axis moved to dim 1.
    moved = p_t.permute(0, 2, 1)
    np.testing.assert_allclose(entropy(moved, dim=1).numpy(), expected, rtol=1e-12)
    assert entropy(p_t).dtype == torch.float64


def test_mean_probs_hand_computed() -> None:
    # member 0: logits [0, 0] -> [0.5, 0.5]; member 1: logits [ln 3, 0] -> [0.75, 0.25]
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])
    out = mean_probs(logits)
    assert out.shape == (1, 2)
    torch.testing.assert_close(out, torch.tensor([[0.625, 0.375]]), atol=1e-7, rtol=0)


def test_mean_probs_matches_numpy_reference() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(scale=3.0, size=(8, 5, 7))
    out = mean_probs(torch.from_numpy(logits))
    assert out.shape == (8, 7)
    np.testing.assert_allclose(out.numpy(), _np_softmax(logits).mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(out.sum(dim=-1).numpy(), np.ones(8), rtol=1e-12)


def test_low_precision_input_is_upcast_to_float32() -> None:
    logits = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float16, torch.bfloat16):
        out = uncertainty_outputs(logits.to(dtype))
        assert out.probs.dtype == torch.float32
        assert out.entropy.dtype == torch.float32
        assert out.mutual_info.dtype == torch.float32
        assert mean_probs(logits.to(dtype)).dtype == torch.float32


def test_mutual_information_of_identical_members_is_zero() -> None:
    one = torch.randn(6, 1, 9, generator=torch.Generator().manual_seed(2)) * 4.0
    logits = one.repeat(1, 5, 1)  # five identical members
    mi = mutual_information(logits)
    assert mi.shape == (6,)
    assert torch.all(mi >= 0)
    torch.testing.assert_close(mi, torch.zeros(6), atol=1e-6, rtol=0)


def test_mutual_information_of_confidently_disagreeing_members_is_ln2() -> None:
    logits = torch.tensor([[[20.0, -20.0], [-20.0, 20.0]]])
    mi = mutual_information(logits)
    assert mi.item() == pytest.approx(math.log(2.0), abs=1e-6)
    # Total entropy is also ln 2 and all of it is epistemic.
    out = uncertainty_outputs(logits)
    assert out.entropy.item() == pytest.approx(math.log(2.0), abs=1e-6)


def test_single_member_gives_exactly_zero_mutual_information() -> None:
    logits = torch.randn(10, 1, 4, generator=torch.Generator().manual_seed(3)) * 5.0
    assert torch.equal(mutual_information(logits), torch.zeros(10))
    assert torch.equal(mutual_information(logits.double()), torch.zeros(10, dtype=torch.float64))
    assert torch.equal(uncertainty_outputs(logits).mutual_info, torch.zeros(10))


def test_mutual_information_matches_entropy_decomposition() -> None:
    rng = np.random.default_rng(4)
    logits = rng.normal(scale=2.0, size=(16, 4, 6))
    member_p = _np_softmax(logits)
    expected = _np_entropy(member_p.mean(axis=1)) - _np_entropy(member_p).mean(axis=1)
    mi = mutual_information(torch.from_numpy(logits))
    np.testing.assert_allclose(mi.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert np.all(expected > 1e-4)  # the members really disagree, so the check is not vacuous


def test_uncertainty_outputs_consistent_with_separate_functions() -> None:
    logits = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(5)) * 3.0
    out = uncertainty_outputs(logits)
    assert isinstance(out, UncertaintyOutputs)
    probs, h, mi = out
    assert probs.shape == (5, 4) and h.shape == (5,) and mi.shape == (5,)
    torch.testing.assert_close(probs, mean_probs(logits), atol=0, rtol=0)
    torch.testing.assert_close(h, entropy(mean_probs(logits)), atol=0, rtol=0)
    torch.testing.assert_close(mi, mutual_information(logits), atol=0, rtol=0)
    # MI is bounded by the total entropy.
    assert torch.all(mi <= h + 1e-6)


def test_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match=r"\[B, M, C\]"):
        mean_probs(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\[B, M, C\]"):
        mutual_information(torch.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"\[B, M, C\]"):
        uncertainty_outputs(torch.zeros(4))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_onnx_export_uses_only_plain_ops(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")

    class Head(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(uncertainty_outputs(x))

    path = tmp_path / "uq_head.onnx"
    example = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(6))
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("members")}
    torch.onnx.export(
        Head().eval(), (example,), str(path), dynamo=True, dynamic_shapes=(dims,), verbose=False
    )
    model = onnx.load(str(path))
    op_types = {node.op_type for node in model.graph.node}
    allowed = {
        "Softmax", "Log", "Mul", "ReduceSum", "ReduceMean", "Clip", "Sub", "Neg", "Unsqueeze",
        "Cast", "Constant", "Max",
    }  # fmt: skip
    assert "Einsum" not in op_types
    assert op_types <= allowed, f"unexpected ONNX ops: {sorted(op_types - allowed)}"

    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(7, 2, 5), (3, 1, 5)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(7)) * 3.0
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        ref = uncertainty_outputs(x)
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_allclose(g, r.numpy(), atol=1e-6, rtol=1e-5)
    # dynamic member axis: M = 1 still gives zero MI in the exported graph
    assert np.all(got[2] == 0.0)
