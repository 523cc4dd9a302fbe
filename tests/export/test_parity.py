"""The shared parity gate (`export/parity.py`): NaN anywhere fails, every contract output is
compared with its shape, and the worst |diff| per output lands in `parity.json` of prune,
fuse and export."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import ok
from uqcompress.engine.modality import synthetic_examples
from uqcompress.export import onnx as uqc_onnx
from uqcompress.export.parity import Parity, contract_outputs, logit_tolerances
from uqcompress.models.loading import load_model, resolve_model_source

NAMES = ("member_logits", "probs", "entropy", "mutual_info")


def _outputs(seed: int = 0, members: int = 3) -> dict[str, Any]:
    logits = torch.randn(5, members, 4, generator=torch.Generator().manual_seed(seed))
    return {k: v.numpy().copy() for k, v in contract_outputs(logits).items()}


# --------------------------------------------------------------------------- the helper


def test_identical_outputs_pass_with_a_worst_value_per_output() -> None:
    parity = Parity(1e-6)
    parity.compare(_outputs(0), _outputs(0))
    parity.compare(_outputs(1), _outputs(1))
    assert parity.passed
    assert parity.batches == 2
    assert set(parity.max_abs_diff) == set(NAMES)
    assert all(v == 0.0 for v in parity.max_abs_diff.values())
    assert parity.to_dict()["max_abs_diff"] == dict.fromkeys(NAMES, 0.0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("side", ["reference", "produced"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_value_in_any_output_on_either_side_fails(
    name: str, side: str, value: float
) -> None:
    reference, produced = _outputs(), _outputs()
    (reference if side == "reference" else produced)[name].flat[0] = value
    parity = Parity(1e-4)
    parity.compare(_outputs(1), _outputs(1))  # a clean batch first: max(0.0, nan) is 0.0
    parity.compare(reference, produced)
    parity.compare(_outputs(2), _outputs(2))  # and a clean one after
    assert not parity.passed
    assert "non-finite" in parity.describe() and name in parity.describe()


def test_both_sides_nan_in_the_same_place_still_fails() -> None:
    reference, produced = _outputs(), _outputs()
    reference["entropy"][2] = produced["entropy"][2] = math.nan
    parity = Parity(1e-4)
    parity.compare(reference, produced)
    assert not parity.passed


@pytest.mark.parametrize("name", NAMES)
def test_a_shape_mismatch_in_any_output_fails(name: str) -> None:
    reference, produced = _outputs(), _outputs()
    # one more row/member: broadcasting would otherwise happily compare [5, 1] with [5]
    produced[name] = np.concatenate([produced[name], produced[name][:1]])
    parity = Parity(1e-4)
    parity.compare(reference, produced)
    assert not parity.passed
    assert f"{name} has shape" in parity.describe()
    assert parity.max_abs_diff[name] == math.inf


def test_a_broadcastable_member_axis_mismatch_fails() -> None:
    reference = _outputs(members=1)
    produced = dict(reference, member_logits=reference["member_logits"][:, 0])  # [B, C]
    parity = Parity(1e-4)
    parity.compare(reference, produced)
    assert not parity.passed


@pytest.mark.parametrize("name", NAMES)
def test_drift_in_one_output_alone_fails_and_is_reported_for_that_output(name: str) -> None:
    reference, produced = _outputs(), _outputs()
    produced[name] = produced[name] + 1e-3
    parity = Parity(1e-4)
    parity.compare(reference, produced)
    assert not parity.passed
    assert parity.max_abs_diff[name] == pytest.approx(1e-3, rel=1e-3)
    assert all(v == 0.0 for k, v in parity.max_abs_diff.items() if k != name)


def test_sequences_in_contract_order_and_torch_tensors_are_accepted() -> None:
    logits = torch.randn(4, 2, 3)
    outputs = contract_outputs(logits)
    parity = Parity(1e-6)
    parity.compare([outputs[n] for n in NAMES], outputs)
    assert parity.passed


def test_no_batch_compared_is_not_a_pass() -> None:
    assert not Parity(1e-4).passed


def test_a_temperature_below_one_widens_only_the_logit_outputs() -> None:
    """Logits divided by T = 0.02 carry the raw logits' round-off times 50: 1.5e-4 there is
    3 float32 ulps of a logit near 250, not drift. The bounded outputs keep atol."""
    assert logit_tolerances(1e-4, 0.02) == {"member_logits": 5e-3, "logits": 5e-3}
    assert logit_tolerances(1e-4, 1.0) == {} and logit_tolerances(1e-4, 3.0) == {}
    reference = _outputs()
    scaled = {**reference, "member_logits": reference["member_logits"] + 1.5e-4}
    plain = Parity(1e-4)
    plain.compare(reference, scaled)
    assert not plain.passed
    calibrated = Parity(1e-4, tolerances=logit_tolerances(1e-4, 0.02))
    calibrated.compare(reference, scaled)
    assert calibrated.passed, calibrated.describe()
    assert calibrated.to_dict()["tolerances"]["member_logits"] == pytest.approx(5e-3)
    assert "member_logits, logits within 0.005 (atol / temperature)" in calibrated.describe()
    # ... and a bounded output drifting by the same amount still fails
    drifted = {**scaled, "probs": scaled["probs"] + 1.5e-4}
    calibrated = Parity(1e-4, tolerances=logit_tolerances(1e-4, 0.02))
    calibrated.compare(reference, drifted)
    assert not calibrated.passed
    # ... as does logit drift beyond atol / T
    far = {**reference, "member_logits": reference["member_logits"] + 6e-3}
    calibrated = Parity(1e-4, tolerances=logit_tolerances(1e-4, 0.02))
    calibrated.compare(reference, far)
    assert not calibrated.passed


# --------------------------------------------------------------------------- the export gate


class _Tampered:
    """A Predictor whose ONNX outputs are altered after running: what a broken graph returns."""

    def __init__(self, inner: Any, tamper: Callable[[Any], Any]) -> None:
        self._inner = inner
        self._tamper = tamper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def run(self, inputs: dict[str, Any]) -> Any:
        return self._tamper(self._inner.run(inputs))


def _nan_entropy(result: Any) -> Any:
    entropy = result.entropy.copy()
    entropy[0] = np.nan
    return replace(result, entropy=entropy)


def _drift_mutual_info(result: Any) -> Any:
    return replace(result, mutual_info=result.mutual_info + 1e-3)


def _extra_member(result: Any) -> Any:
    return replace(result, member_logits=np.concatenate([result.member_logits] * 2, axis=1))


@pytest.mark.parametrize(
    ("tamper", "needle"),
    [
        (_nan_entropy, "entropy: 1 non-finite"),
        (_drift_mutual_info, "mutual_info 1.00e-03"),
        (_extra_member, "member_logits has shape"),
    ],
)
def test_export_gate_fails_on_nan_drift_or_shape_outside_probs(
    vit_onnx_nodata: Path, tiny_vit_artifact: Path, tamper: Callable[[Any], Any], needle: str
) -> None:
    from uqcompress.export.graph import graph_for
    from uqcompress.export.runtime import Predictor

    loaded = load_model(resolve_model_source(tiny_vit_artifact))
    graph = graph_for(loaded.model, "image")
    data = synthetic_examples(loaded)
    predictor = Predictor(vit_onnx_nodata)
    reference = uqc_onnx.parity_reference(graph, loaded, predictor, data)
    good = uqc_onnx.check_parity(reference, predictor, 1e-4)
    assert good.passed, good.describe()
    bad = uqc_onnx.check_parity(reference, _Tampered(predictor, tamper), 1e-4)
    assert bad.max_abs_diff["probs"] <= 1e-4  # probs alone would have passed
    assert not bad.passed
    assert needle in bad.describe()


def test_export_parity_json_holds_every_output(vit_onnx_nodata: Path) -> None:
    parity = json.loads((vit_onnx_nodata / "parity.json").read_text())
    # the contract's four and the `logits` output Hugging Face loaders read
    assert set(parity["max_abs_diff"]) == {*NAMES, "logits"}
    assert all(0.0 <= v <= 1e-4 for v in parity["max_abs_diff"].values())
    assert parity["problems"] == [] and parity["passed"] is True


# --------------------------------------------------------------------------- prune and fuse


def _random_member_scores(cli: Any, model: Path) -> str:
    return ok(
        cli(
            "score",
            model,
            "--method",
            "random",
            "--members",
            "2",
        )
    )


def test_prune_and_fuse_write_per_output_parity(cli: Any, tiny_vit_artifact: Path) -> None:
    scores = ok(cli("score", tiny_vit_artifact, "--method", "random"))
    pruned = Path(ok(cli("prune", scores, "--ratio", "0.5")))
    parity = json.loads((pruned / "parity.json").read_text())
    assert set(parity["max_abs_diff"]) == set(NAMES)
    assert parity["passed"] and all(v < 1e-5 for v in parity["max_abs_diff"].values())
    assert parity["max_abs_diff"]["mutual_info"] == 0.0  # M = 1

    members = Path(
        ok(cli("prune", _random_member_scores(cli, tiny_vit_artifact), "--members", "2"))
    )
    parity = json.loads((members / "parity.json").read_text())
    assert set(parity["max_abs_diff"]) == set(NAMES) and parity["batches"] == 2

    fused = Path(ok(cli("fuse", members)))
    parity = json.loads((fused / "parity.json").read_text())
    assert set(parity["max_abs_diff"]) == set(NAMES)
    assert parity["passed"] and all(v < 1e-4 for v in parity["max_abs_diff"].values())


def test_prune_members_gate_catches_nan_in_the_first_member(
    cli: Any, tiny_vit_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old running maximum started at 0.0: max(0.0, nan) is 0.0, so a NaN member passed."""
    from uqcompress.models import surgery

    scores = _random_member_scores(cli, tiny_vit_artifact)
    real = surgery.prune_heads
    calls: list[int] = []

    def nan_first_member(loaded: Any, keep: list[list[int]]) -> None:
        real(loaded, keep)
        if not calls:  # member 0 only; the base model's shapes are unaffected
            with torch.no_grad():
                loaded.model.classifier.bias.fill_(math.nan)
        calls.append(1)

    monkeypatch.setattr(surgery, "prune_heads", nan_first_member)
    out = tmp_path / "members"
    result = cli("prune", scores, "--members", "2", "--out", out)
    assert result.code == 3, result.err  # a failed quality gate
    assert "non-finite values in the rewritten model" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert result.out == "" and not out.exists()
