"""Latency (issue 26 item 5): model-only time is measured the same way on torch and ONNX
(warm, preprocessing outside the timer); end-to-end time is its own metric."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ok

DATA = "builtin:digits@val"
BATCH = 8
SLEEP = 0.05  # seconds of "preprocessing" per batch


def _eval(cli: Any, model: Path, out: Path) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    args = ["eval", str(model), "--data", DATA, "--batch-size", str(BATCH), "--out", str(out)]
    path = ok(cli(*args))
    metrics: dict[str, Any] = json.loads((Path(path) / "metrics.json").read_text())
    return metrics


def test_onnx_latency_excludes_preprocessing(  # type: ignore[no-untyped-def]
    cli, vit_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uqcompress.export.runtime import Predictor

    original = Predictor.encode_pixels

    def slow(self: Predictor, pixels: Any) -> Any:
        time.sleep(SLEEP)
        return original(self, pixels)

    monkeypatch.setattr(Predictor, "encode_pixels", slow)
    metrics = _eval(cli, vit_onnx, tmp_path / "eval")
    per_example = 1000.0 * SLEEP / BATCH  # 6.25 ms of sleep per example
    # The old timer wrapped the preprocessing: latency_ms was >= 6.25 here.
    assert metrics["latency_ms"] < per_example / 4
    assert metrics["latency_e2e_ms"] >= per_example
    assert metrics["latency_e2e_ms"] > metrics["latency_ms"]
    assert metrics["latency_batch_size"] == BATCH
    assert metrics["latency_threads"] >= 1


def test_torch_and_onnx_report_the_same_latency_keys(  # type: ignore[no-untyped-def]
    cli, tiny_vit_artifact: Path, vit_onnx: Path, tmp_path: Path
) -> None:
    torch_metrics = _eval(cli, tiny_vit_artifact, tmp_path / "torch")
    onnx_metrics = _eval(cli, vit_onnx, tmp_path / "onnx")
    for metrics in (torch_metrics, onnx_metrics):
        assert 0 < metrics["latency_ms"] <= metrics["latency_e2e_ms"]
        assert metrics["latency_batch_size"] == BATCH
    assert torch_metrics["latency_threads"] == onnx_metrics["latency_threads"]


def test_warmup_runs_once_per_source_untimed() -> None:
    """The first batch's warm-up pass is in neither model nor end-to-end time."""
    import numpy as np

    from uqcompress.engine.sources import MemberOutputs, _timed

    outputs = MemberOutputs(
        member_logits=np.zeros((1, 1, 2), dtype=np.float32),
        probs=np.full((1, 2), 0.5),
        entropy=np.zeros(1),
        mutual_info=np.zeros(1),
        seconds=0.1,
        warmup_seconds=0.3,
    )
    assert _timed(outputs, 0.5).e2e_seconds == pytest.approx(0.2)
    assert _timed(outputs, 0.35).e2e_seconds == pytest.approx(0.1)  # never below model time


def test_eval_v1_artifacts_still_read(tmp_path: Path) -> None:
    """kind_version 2 of eval; a version-1 manifest is migrated on read."""
    from uqcompress.artifacts.kinds import KIND_VERSIONS, MIGRATIONS

    assert KIND_VERSIONS["eval"] == 2
    raw = {"kind": "eval", "kind_version": 1, "summary": {"latency_ms": 9.0}}
    assert MIGRATIONS[("eval", 1)](dict(raw))["summary"] == {"latency_ms": 9.0}
