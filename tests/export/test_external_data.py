"""Exports whose weights exceed protobuf's 2 GiB go to ONNX external data: the artifact holds
`model.onnx` and `model.onnx.data`, verifies, and predicts exactly like a one-file export.
(The threshold is lowered here so that a tiny model takes the same path.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ok


def test_weights_over_the_threshold_go_to_external_data(
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one_file = Path(ok(cli("export", tiny_bert_artifact, "--out", tmp_path / "one")))
    monkeypatch.setattr("uqcompress.export.onnx.EXTERNAL_DATA_BYTES", 0)
    split = Path(ok(cli("export", tiny_bert_artifact, "--out", tmp_path / "split")))
    manifest = json.loads((split / "manifest.json").read_text())
    assert manifest["summary"]["external_data"] == "model.onnx.data"
    listed = set(manifest["files"])
    assert {"model.onnx", "model.onnx.data"} <= listed
    data = (split / "model.onnx.data").stat().st_size
    graph = (split / "model.onnx").stat().st_size
    # the large weights left the graph (the exporter keeps tiny tensors inline)
    assert data > 0 and graph + data >= (one_file / "model.onnx").stat().st_size > graph
    assert not (one_file / "model.onnx.data").exists()
    assert json.loads((split / "parity.json").read_text())["passed"] is True
    assert cli("verify", split).code == 0
    texts = sentiment_csv["test"]
    a = ok(cli("predict", one_file, "--data", texts)).splitlines()
    b = ok(cli("predict", split, "--data", texts)).splitlines()
    assert a == b  # the same weights, the same predictions
