"""How inputs reach a step: '-' on stdin (paths or --json), environment, duplicates."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest


def test_dash_accepts_json_and_blank_lines(cli, tiny_bert_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    as_json = json.dumps({"path": str(tiny_bert_artifact), "kind": "model"}, indent=2)
    assert cli("verify", "-", stdin=as_json).out.strip() == str(tiny_bert_artifact)
    assert cli("verify", "-", stdin=f"\n\n{tiny_bert_artifact}\n").code == 0
    two = cli("verify", "-", stdin=f"{tiny_bert_artifact}\n{tiny_bert_artifact}\n")
    assert two.code == 1 and "exactly one path" in two.err


def test_dash_refuses_a_terminal(cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(""))
    result = cli("verify", "-")
    assert result.code == 1 and "stdin is a terminal" in result.err


def test_bad_uqc_threads_names_the_variable(
    cli,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    monkeypatch.setenv("UQC_THREADS", "abc")
    result = cli("eval", str(tiny_bert_artifact), "--data", str(sentiment_csv["test"]))
    assert result.code == 1 and "UQC_THREADS='abc'" in result.err


def test_the_same_model_twice_is_not_an_ensemble(
    cli,
    tiny_bert_artifact: Path,  # type: ignore[no-untyped-def]
    sentiment_csv: dict[str, Path],
) -> None:
    result = cli(
        "eval",
        str(tiny_bert_artifact),
        str(tiny_bert_artifact),
        "--data",
        str(sentiment_csv["test"]),
    )
    assert result.code == 1 and "more than once" in result.err
    assert result.out == ""
