"""`uqc calibrate`: temperature and abstention fitted on held-out data, applied everywhere."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ok
from uqcompress.uq import calibration as cal
from uqcompress.uq import metrics as m

# --- the math ---------------------------------------------------------------------------


def _sampled_task(n: int, members: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Member logits whose averaged softmax is calibrated *by construction*: labels are drawn
    from it. Shape: logits `[n, members, 5]`, labels `[n]`."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2.0, (n, members, 5))
    probs = m.softmax(logits).mean(axis=1)
    labels = np.array([rng.choice(5, p=p) for p in probs])
    return logits, labels


@pytest.mark.parametrize("members", [1, 3])
def test_temperature_recovers_the_scale_that_made_logits_overconfident(members: int) -> None:
    logits, labels = _sampled_task(4000, members, seed=members)
    assert cal.fit_temperature(logits, labels) == pytest.approx(1.0, abs=0.1)
    # Logits 3x too sharp: the fitted T undoes it, and the NLL drops.
    sharp = 3.0 * logits
    t = cal.fit_temperature(sharp, labels)
    assert t == pytest.approx(3.0, rel=0.1)
    before = m.nll(m.softmax(sharp).mean(axis=1), labels)
    after = m.nll(m.softmax(sharp / t).mean(axis=1), labels)
    assert after < before - 0.1


def test_temperature_on_degenerate_data_moves_the_right_way_within_bounds() -> None:
    logits = np.zeros((50, 1, 3))
    logits[:, 0, 0] = 5.0
    # Every example right: sharpening always lowers the NLL, so T < 1.
    all_right = cal.fit_temperature(logits, np.zeros(50, dtype=int))
    assert cal.MIN_TEMPERATURE <= all_right < 0.5
    # Every example confidently wrong: flattening always helps, so T grows to its bound.
    all_wrong = cal.fit_temperature(logits, np.ones(50, dtype=int))
    assert 10 < all_wrong <= cal.MAX_TEMPERATURE


def test_abstain_threshold_answers_the_asked_fraction() -> None:
    scores = np.random.default_rng(0).random(1000)
    for coverage in (0.5, 0.9, 1.0):
        threshold = cal.fit_abstain_threshold(scores, coverage)
        assert np.mean(scores <= threshold) == pytest.approx(coverage, abs=1e-9)
    # Ties at the threshold are all answered: coverage may only go up.
    tied = np.array([0.1, 0.2, 0.2, 0.2, 0.9])
    assert cal.fit_abstain_threshold(tied, 0.4) == 0.2
    rule = cal.AbstainRule(score="msp", threshold=0.2, coverage=0.4)
    assert cal.abstains(rule, {"msp": tied}).tolist() == [False, False, False, False, True]


def test_selective_risk_counts_errors_among_answered_only() -> None:
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.4, 0.6], [0.45, 0.55]])
    labels = np.array([0, 1, 1, 0])
    coverage, risk = cal.selective_risk(probs, labels, np.array([True, True, False, False]))
    assert (coverage, risk) == (0.5, 0.5)
    assert np.isnan(cal.selective_risk(probs, labels, np.zeros(4, dtype=bool))[1])


# --- the step, on a deliberately over-confident model -------------------------------------


@pytest.fixture(scope="module")
def overconfident_vit(tmp_path_factory: pytest.TempPathFactory, tiny_vit_artifact: Path) -> Path:
    """The untrained tiny ViT with its classifier scaled 40x: near-chance accuracy on digits,
    with near-certain probabilities (a transformers directory, which every step accepts)."""
    import torch

    from uqcompress.models.loading import load_model, resolve_model_source, save_model

    loaded = load_model(resolve_model_source(tiny_vit_artifact))
    with torch.no_grad():
        loaded.model.classifier.weight.mul_(40.0)  # type: ignore[operator]
        loaded.model.classifier.bias.mul_(40.0)  # type: ignore[operator]
    path = tmp_path_factory.mktemp("overconfident") / "vit"
    save_model(loaded, path)
    return path


def _calibrate(cli: Callable[..., Any], model: Path | str, out: Path, *extra: str) -> Path:
    """`uqc calibrate MODEL --data digits@val --out OUT [extra]`: the calibrated model."""
    return Path(ok(cli("calibrate", model, "--data", "builtin:digits@val", "--out", out, *extra)))


def _summary(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / "manifest.json").read_text())["summary"]


def test_calibrate_lowers_nll_and_every_consumer_applies_it(
    cli: Callable[..., Any], overconfident_vit: Path, tmp_path: Path
) -> None:
    result = cli(
        "calibrate",
        overconfident_vit,
        "--data",
        "builtin:digits@val",
        "--abstain-coverage",
        "0.8",
        "--out",
        tmp_path / "calibrated",
    )
    assert result.code == 0, result.err
    calibrated = Path(result.out.strip())
    summary = _summary(calibrated)
    assert summary["temperature"] > 5  # undoes (most of) the 40x
    assert summary["nll_after"] < summary["nll_before"] / 3
    assert summary["ece_after"] < summary["ece_before"]
    assert summary["abstain_coverage"] == pytest.approx(0.8, abs=0.01)
    assert "NLL" in result.err and "abstain when msp" in result.err
    assert json.loads((calibrated / "config.json").read_text())["uqc_calibration"][
        "temperature"
    ] == pytest.approx(summary["temperature"])

    # eval on other data: NLL better than the same model uncalibrated, both reported
    before = cli("eval", overconfident_vit, "--data", "builtin:digits@test", "--json")
    after = cli("eval", calibrated, "--data", "builtin:digits@test", "--json")
    assert before.code == 0 and after.code == 0, after.err
    plain, cal_metrics = json.loads(before.out)["summary"], json.loads(after.out)["summary"]
    assert cal_metrics["nll"] < plain["nll"] / 3
    assert cal_metrics["nll_uncalibrated"] == pytest.approx(plain["nll"], rel=1e-5)
    assert cal_metrics["ece_uncalibrated"] == pytest.approx(plain["ece"], rel=1e-5)
    assert cal_metrics["acc"] == pytest.approx(plain["acc"])  # T > 0 never changes argmax
    assert 0.6 < cal_metrics["abstain_coverage"] < 0.95
    assert "calibrated (temperature" in after.err

    # export: the temperature is in the graph, the rule in the metadata; ONNX == torch
    exported = cli("export", calibrated, "--format", "onnx", "--data", "builtin:digits@test")
    assert exported.code == 0, exported.err
    onnx_path = Path(exported.out.strip())
    onnx_eval = cli("eval", onnx_path, "--data", "builtin:digits@test", "--json")
    onnx_metrics = json.loads(onnx_eval.out)["summary"]
    for key in ("nll", "ece", "nll_uncalibrated", "abstain_coverage", "abstain_risk"):
        assert onnx_metrics[key] == pytest.approx(cal_metrics[key], abs=1e-4), key

    # predict (torch and ONNX Runtime) says abstain: true|false, as often as eval counted
    for model in (calibrated, onnx_path):
        predicted = cli("predict", model, "--data", "builtin:digits@test")
        records = [json.loads(line) for line in predicted.out.splitlines()]
        flags = [r["abstain"] for r in records]
        assert set(flags) == {True, False}
        answered = 1 - sum(flags) / len(flags)
        assert answered == pytest.approx(cal_metrics["abstain_coverage"], abs=0.01)


def test_calibration_is_not_carried_into_a_derived_model(
    cli: Callable[..., Any], overconfident_vit: Path, tmp_path: Path
) -> None:
    source = _calibrate(cli, overconfident_vit, tmp_path / "c")
    tuned = cli("finetune", source, "--data", "builtin:digits@val", "--epochs", "1", "--json")
    assert tuned.code == 0, tuned.err
    payload = json.loads(tuned.out)
    assert any("not carried over" in w for w in payload["warnings"])
    config = json.loads((Path(payload["path"]) / "config.json").read_text())
    assert "uqc_calibration" not in config
    # and the calibrated input itself still verifies: inputs are never edited
    assert cli("verify", source).code == 0


def test_recalibrating_starts_from_the_uncalibrated_logits(
    cli: Callable[..., Any], overconfident_vit: Path, tmp_path: Path
) -> None:
    first = _calibrate(cli, overconfident_vit, tmp_path / "a")
    again = cli("calibrate", first, "--data", "builtin:digits@val", "--json")
    assert again.code == 0, again.err
    twice = json.loads(again.out)
    assert twice["summary"]["temperature"] == pytest.approx(
        _summary(first)["temperature"], rel=1e-6
    )
    assert any("calibrated already" in w for w in twice["warnings"])


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--abstain-coverage", "0"], "--abstain-coverage 0.0 must be in (0, 1]"),
        (["--abstain-coverage", "1.5"], "--abstain-coverage 1.5 must be in (0, 1]"),
        (["--abstain-score", "margin"], "unknown --abstain-score 'margin'"),
        (["--abstain-coverage", "0.9", "--abstain-score", "mi"], "mi needs an ensemble"),
    ],
)
def test_calibrate_bad_input(
    cli: Callable[..., Any],
    tiny_vit_artifact: Path,
    extra: list[str],
    needle: str,
    _artifacts_root: Path,
) -> None:
    result = cli("calibrate", tiny_vit_artifact, "--data", "builtin:digits@val", *extra)
    assert result.code == 1
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert lines[-1].startswith("error:") and needle in lines[-1], result.err
    assert not _artifacts_root.exists() or not any(_artifacts_root.iterdir())


def test_calibrate_refuses_an_onnx_artifact(cli: Callable[..., Any], vit_onnx: Path) -> None:
    result = cli("calibrate", vit_onnx, "--data", "builtin:digits@val")
    assert result.code == 1
    assert "is an onnx artifact; uqc calibrate takes a model" in result.err
    assert "calibrate the model, then export it" in result.err


def test_safetensors_export_and_import_keep_the_calibration_and_eval_gates_on_it(
    cli: Callable[..., Any], overconfident_vit: Path, tmp_path: Path
) -> None:
    import shutil

    calibrated = _calibrate(cli, overconfident_vit, tmp_path / "c", "--abstain-coverage", "0.8")
    temperature = _summary(calibrated)["temperature"]
    exported = cli("export", calibrated, "--format", "safetensors", "--json")
    payload = json.loads(exported.out)
    assert any("does not apply it" in w for w in payload["warnings"])
    plain = tmp_path / "plain"  # the export as a plain transformers directory
    shutil.copytree(payload["path"], plain, ignore=shutil.ignore_patterns("manifest.json"))
    imported = cli("import", plain)
    assert imported.code == 0, imported.err
    back = Path(imported.out.strip())
    assert _summary(back)["calibration"]["temperature"] == pytest.approx(temperature)
    # eval --gate knows the calibration metrics of a calibrated model, and only of one
    gated = cli("eval", back, "--data", "builtin:digits@test", "--gate", "abstain_coverage>=0.5")
    assert gated.code == 0, gated.err
    refused = cli(
        "eval", overconfident_vit, "--data", "builtin:digits@test", "--gate", "temperature<=2"
    )
    assert refused.code == 1 and "unknown metric 'temperature'" in refused.err


@pytest.mark.parametrize("score", ["entropy", "msp"])
def test_the_abstain_threshold_is_fitted_on_the_values_every_consumer_computes(
    cli: Callable[..., Any], overconfident_vit: Path, tmp_path: Path, score: str
) -> None:
    """Issue 14, item 20: the threshold is one of the scores `predict` computes (bitwise:
    same formula, same float32 dtype), and the ONNX Predictor's to float32 round-off."""
    from uqcompress.data import load_data
    from uqcompress.engine.sources import TorchSource
    from uqcompress.export.runtime import Predictor

    extra = ("--abstain-coverage", "0.8", "--abstain-score", score)
    calibrated = _calibrate(cli, overconfident_vit, tmp_path / "c", *extra)
    threshold = _summary(calibrated)["abstain_threshold"]
    data = load_data("builtin:digits@val")
    torch_out = TorchSource(calibrated, "model", "cpu").predict(data, 64, None)
    torch_scores = cal.abstain_scores(torch_out.probs, torch_out.entropy, torch_out.mutual_info)
    assert threshold in set(torch_scores[score].tolist())
    if score == "entropy":
        assert float(np.float32(threshold)) == threshold  # a float32 value, as deployed
        onnx_path = Path(ok(cli("export", calibrated, "--out", tmp_path / "onnx")))
        assert data.images is not None
        got = Predictor(onnx_path).predict_pixels(data.images.as_pixels(1))
        assert np.abs(got.entropy.astype(np.float64) - threshold).min() <= 1e-6
        assert np.abs(got.entropy - torch_out.entropy).max() <= 1e-5


def test_calibrate_in_bfloat16_fits_the_float32_temperature(
    cli: Callable[..., Any], trained_bert_artifact: Path, sentiment_csv: dict[str, Path]
) -> None:
    """--dtype bfloat16: the logits the temperature is fitted to come from a bfloat16 model
    (saved as such); the temperature stays within a few percent of float32's."""
    from safetensors import safe_open

    fitted = {}
    for dtype in ("float32", "bfloat16"):
        args = ("calibrate", str(trained_bert_artifact), "--data", str(sentiment_csv["test"]))
        fitted[dtype] = json.loads(ok(cli(*args, "--dtype", dtype, "--json")))
    half, full = fitted["bfloat16"], fitted["float32"]
    assert half["summary"]["dtype"] == "bfloat16" and full["summary"]["dtype"] == "float32"
    assert half["id"] != full["id"]
    t_half, t_full = half["summary"]["temperature"], full["summary"]["temperature"]
    assert t_full not in (cal.MIN_TEMPERATURE, cal.MAX_TEMPERATURE)
    assert abs(t_half - t_full) / t_full < 0.05
    with safe_open(str(Path(half["path"]) / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in list(f.keys())} == {"BF16"}
