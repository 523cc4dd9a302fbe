"""`uqc finetune --dtype`: a half dtype trains in mixed precision (float32 master weights,
computed in the dtype) and saves the model in it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import safe_open

from tests.conftest import ok


def _manifest(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "manifest.json").read_text()))


def _weight_dtypes(path: Path) -> set[str]:
    with safe_open(str(path / "model.safetensors"), "pt") as handle:
        return {str(handle.get_tensor(name).dtype) for name in handle.keys()}  # noqa: SIM118


def _finetune(cli: Callable[..., Any], model: Path, data: Path, out: Path, *extra: str) -> Any:
    args = ("--data", data, "--epochs", "3", "--lr", "3e-3", "--batch-size", "16")
    return cli("finetune", model, *args, *extra, "--out", out)


def test_bfloat16_trains_in_mixed_precision_and_saves_in_bfloat16(
    cli: Callable[..., Any],
    tiny_llama_artifact: Path,
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    data = sentiment_csv["train"]
    full = Path(ok(_finetune(cli, tiny_llama_artifact, data, tmp_path / "fp32")))
    half = Path(
        ok(_finetune(cli, tiny_llama_artifact, data, tmp_path / "bf16", "--dtype", "bfloat16"))
    )

    # saved in bfloat16, config.json and the summary saying so
    assert _weight_dtypes(half) == {"torch.bfloat16"}
    assert _weight_dtypes(full) == {"torch.float32"}
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    manifest = _manifest(half)
    assert manifest["summary"]["dtype"] == "bfloat16"
    assert manifest["config"]["dtype"] == "bfloat16" and manifest["config"]["precision"] == "bf16"
    assert _manifest(full)["config"]["precision"] == "fp32"

    # it learnt what float32 learnt: float32 master weights keep the small updates
    # (pure bfloat16 AdamW rounds updates below 2^-8 of a weight away)
    curve_half = manifest["summary"]["loss_curve"]
    curve_full = _manifest(full)["summary"]["loss_curve"]
    assert curve_half[-1] < 0.8 * curve_half[0]
    assert abs(curve_half[-1] - curve_full[-1]) <= 0.1 * curve_full[-1] + 0.02, (
        curve_half,
        curve_full,
    )

    # `--precision bf16` beside it is the same run (same id: reused)
    again = _finetune(
        cli,
        tiny_llama_artifact,
        data,
        tmp_path / "bf16",
        "--dtype",
        "bfloat16",
        "--precision",
        "bf16",
    )
    assert ok(again) == str(half) and "reusing it" in again.err

    # the half model is a model like any other: eval reads it in its dtype
    evaluated = ok(cli("eval", half, "--data", sentiment_csv["test"], "--dtype", "bfloat16"))
    assert _manifest(Path(evaluated))["summary"]["acc"] >= 0.7


def test_a_precision_that_contradicts_the_dtype_is_one_line(
    cli: Callable[..., Any],
    tiny_llama_artifact: Path,
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    out = tmp_path / "never"
    result = _finetune(
        cli,
        tiny_llama_artifact,
        sentiment_csv["train"],
        out,
        "--dtype",
        "float16",
        "--precision",
        "bf16",
    )
    assert result.code == 1
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "--precision bf16 contradicts --dtype float16" in lines[0]
    assert "fix:" in lines[0] and "--precision fp16" in lines[0]
    assert not out.exists()
