"""uqc score --dtype: scores computed in bfloat16 rank the heads as float32 does; the dtype is
recorded and is part of the artifact id."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import spearmanr

from tests.conftest import ok


@pytest.mark.parametrize(("family", "method"), [("llama", "hies"), ("bert", "taylor")])
def test_bfloat16_scores_rank_heads_as_float32(
    cli: Callable[..., Any], sentiment_csv: dict[str, Path], family: str, method: str
) -> None:
    from safetensors.torch import load_file

    model = ok(cli("init", "--family", family, "--preset", "tiny", "--labels", "neg,pos"))
    runs = {}
    for dtype in ("float32", "bfloat16"):
        result = cli(
            "score", model, "--data", str(sentiment_csv["train"]), "--method", method,
            "--calib-size", "64", "--dtype", dtype, "--json",
        )  # fmt: skip
        runs[dtype] = json.loads(ok(result))
    assert runs["float32"]["summary"]["dtype"] == "float32"
    assert runs["bfloat16"]["summary"]["dtype"] == "bfloat16"
    assert runs["float32"]["id"] != runs["bfloat16"]["id"]
    scores = [
        load_file(str(Path(runs[d]["path"]) / "scores.safetensors"))["score"].flatten()
        for d in ("float32", "bfloat16")
    ]
    assert scores[0].numel() >= 8
    assert spearmanr(scores[0].numpy(), scores[1].numpy()).statistic >= 0.95


def test_auto_is_float32_for_a_small_model_and_keeps_its_id(
    cli: Callable[..., Any], sentiment_csv: dict[str, Path]
) -> None:
    model = ok(cli("init", "--family", "llama", "--preset", "tiny", "--labels", "neg,pos"))
    common = ("score", model, "--data", str(sentiment_csv["train"]), "--method", "l2", "--json")
    auto = json.loads(ok(cli(*common)))
    explicit = json.loads(ok(cli(*common, "--dtype", "float32")))
    assert auto["summary"]["dtype"] == "float32"
    assert auto["id"] == explicit["id"]  # float32 is left out of the id: earlier ids hold


def test_an_unknown_dtype_is_one_clear_line(cli: Callable[..., Any]) -> None:
    model = ok(cli("init", "--family", "bert", "--preset", "tiny", "--labels", "neg,pos"))
    result = cli("score", model, "--method", "l2", "--dtype", "float8")
    assert result.code == 1
    assert "--dtype 'float8' is not one of float32, bfloat16, float16, auto" in result.err
    assert result.out == ""
