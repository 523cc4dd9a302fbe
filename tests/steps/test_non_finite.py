"""Issue 26 item 19: a model whose outputs are NaN or infinite is one error line, never a
traceback, a NaN in predict's JSON or a NaN scores artifact."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from uqcompress.errors import NonFiniteError
from uqcompress.models.factory import create_model
from uqcompress.models.loading import save_model


def nan_model(directory: Path, family: str = "bert") -> Path:
    """A transformers dir whose classifier holds one NaN weight: every output is NaN."""
    labels = ["neg", "pos"] if family != "vit" else [str(d) for d in range(10)]
    loaded = create_model(family, labels)
    with torch.no_grad():
        dict(loaded.model.named_parameters())["classifier.weight"].view(-1)[0] = math.nan
    save_model(loaded, directory)
    return directory


COMMANDS: dict[str, Callable[[Path, str, Path], list[str]]] = {
    "eval": lambda m, d, t: ["eval", str(m), "--data", d, "--out", str(t / "e")],
    "calibrate": lambda m, d, t: ["calibrate", str(m), "--data", d, "--out", str(t / "c")],
    "predict": lambda m, d, t: ["predict", str(m), "--data", d, "--out", str(t / "p.jsonl")],
    "predict to stdout": lambda m, d, t: ["predict", str(m), "--data", d],
    "score --method hies": lambda m, d, t: [
        "score",
        str(m),
        "--method",
        "hies",
        "--data",
        d,
        "--calib-size",
        "8",
        "--out",
        str(t / "s"),
    ],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_nan_outputs_are_one_error_line(
    command: str,
    cli: Callable[..., Any],
    tmp_path: Path,
    sentiment_csv: dict[str, Path],
    _artifacts_root: Path,
) -> None:
    model = nan_model(tmp_path / "nan-model")
    out = tmp_path / "out"
    out.mkdir()
    result = cli(*COMMANDS[command](model, str(sentiment_csv["test"]), out))
    assert result.code == 1, result.err
    assert result.out == ""  # no NaN JSON lines, no artifact path
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err  # no traceback, no progress line before it
    assert lines[0].startswith("error: ") and "(fix: " in lines[0]
    assert str(model) in lines[0] and "NaN or infinite" in lines[0]
    assert "1 non-finite value (in classifier.weight)" in lines[0]
    assert list(out.iterdir()) == []  # nothing written, no temp files
    assert not _artifacts_root.exists() or not any(_artifacts_root.iterdir())


def test_the_message_counts_the_examples_and_names_the_first(
    cli: Callable[..., Any], tmp_path: Path, sentiment_csv: dict[str, Path]
) -> None:
    result = cli(
        "eval", nan_model(tmp_path / "m"), "--data", sentiment_csv["test"], "--batch-size", "8"
    )
    assert "for example 0 and 7 more of its batch of 8" in result.err


def test_onnx_outputs_are_checked_too(
    cli: Callable[..., Any], vit_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ONNX Runtime path goes through the same check (an int8 or fp16 graph can
    overflow where torch did not)."""
    from uqcompress.export.runtime import Predictor

    real = Predictor.run

    def overflowing(self: Predictor, inputs: dict[str, Any]) -> Any:
        got = real(self, inputs)
        got.probs[3] = np.inf
        return got

    monkeypatch.setattr(Predictor, "run", overflowing)
    result = cli("predict", vit_onnx, "--data", "builtin:digits@test", "--batch-size", "16")
    assert result.code == 1 and result.out == ""
    lines = result.err.strip().splitlines()
    assert (
        len(lines) == 1
        and f"{vit_onnx} computes NaN or infinite outputs for example 3" in (lines[0])
    )
    assert "re-export it" in lines[0]


def test_finite_weights_with_infinite_outputs_say_so(
    tmp_path: Path, sentiment_csv: dict[str, Path], tiny_bert_artifact: Path
) -> None:
    """Weights that are all finite but outputs that overflow: the message says the weights
    are finite (not "re-import from finite weights")."""
    from uqcompress.data import load_data
    from uqcompress.engine.sources import TorchSource, check_finite

    source = TorchSource(tiny_bert_artifact, "model", "cpu")
    data = load_data(str(sentiment_csv["test"]))
    outputs = source.predict(data, 64, None)
    outputs.member_logits[5, 0, 1] = np.float32(np.inf)
    with pytest.raises(NonFiniteError, match="for example 5;") as caught:
        check_finite(outputs, source, None)
    assert "its weights are all finite" in str(caught.value)
    assert "lower --lr" in (caught.value.hint or "")


def test_streamed_batches_name_the_example_of_the_whole_set(
    cli: Callable[..., Any], tmp_path: Path, sentiment_csv: dict[str, Path], monkeypatch: Any
) -> None:
    """A NaN in the third batch of 8 names example 16 + its row, not its index in the batch."""
    from tests.conftest import ok
    from uqcompress.engine import sources

    real_predict = sources.TorchSource._predict
    calls = {"n": 0}

    def third_batch_nan(self: Any, *args: Any) -> Any:
        got = real_predict(self, *args)
        calls["n"] += 1
        if calls["n"] == 3:
            got.member_logits[2, 0, 0] = np.float32(np.nan)
        return got

    monkeypatch.setattr(sources.TorchSource, "_predict", third_batch_nan)
    model = ok(cli("init", "--family", "bert", "--labels", "neg,pos", "--out", tmp_path / "m"))
    result = cli("predict", model, "--data", sentiment_csv["test"], "--batch-size", "8")
    assert result.code == 1
    assert result.out == ""  # the JSON lines of the first two batches were never printed
    assert "for example 18;" in result.err and "its weights are all finite" in result.err


@pytest.mark.parametrize("form", ["onnx", "safetensors"])
def test_export_refuses_non_finite_weights_before_exporting(
    form: str, cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Before: the ONNX parity gate failed (exit 3) with "ONNX output disagrees with PyTorch
    ... (fix: report this with the model ...)", blaming the export."""
    model = nan_model(tmp_path / "nan")
    result = cli("export", model, "--format", form, "--out", tmp_path / "x")
    assert result.code == 1 and result.out == ""
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert lines == [
        f"error: {model} cannot be exported: its weights hold 1 non-finite value (in "
        "classifier.weight) (fix: export a model with finite weights (retrain or re-import it))"
    ]
    assert not (tmp_path / "x").exists()
