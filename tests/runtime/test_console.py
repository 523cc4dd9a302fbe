"""The stderr console prints user values as written (issue 26 item 25): rich turned
`:smile:` in a path, data spec or label into an emoji, and read `[bold]` as markup."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import ok

ODD = ":smile: [bold]x[red]"  # no "/": it is part of file names


def test_eval_table_and_messages_print_user_values_as_written(
    cli: Callable[..., Any],
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    model = tmp_path / f"model {ODD}"
    shutil.copytree(tiny_bert_artifact, model)
    data = tmp_path / "test :smile:.csv"  # (brackets: the CSV reader takes them as a glob)
    shutil.copy(sentiment_csv["test"], data)
    result = cli("eval", model, "--data", data, "--out", tmp_path / "ev")
    ok(result)
    flat = " ".join(result.err.split())
    assert f"uqc eval: {data}" in flat  # the table's title
    assert f"model {ODD}" in flat  # the model column
    assert "\N{SMILING FACE WITH OPEN MOUTH AND SMILING EYES}" not in result.err
    assert "😄" not in result.err and "😃" not in result.err
    again = cli("eval", model, "--data", data, "--out", tmp_path / "ev")  # reused: a message
    assert "same inputs and config as before" in again.err
    assert "ev: same inputs" in again.err


def test_an_error_line_keeps_emoji_codes_and_brackets(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    missing = tmp_path / f"nope {ODD}"
    result = cli("eval", missing, "--data", "builtin:digits@test")
    assert result.code == 1 and result.out == ""
    assert str(missing) in result.err, result.err
    assert "😄" not in result.err


def test_inspect_prints_labels_and_paths_as_written(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    made = ok(cli("init", "--family", "vit", "--labels", ":smile:,[red]b[/red]",
                  "--out", tmp_path / f"vit {ODD}"))  # fmt: skip
    result = cli("inspect", made)
    ok(result)
    flat = " ".join(result.err.split())
    assert ":smile:" in flat and "[red]b[/red]" in flat
    assert f"vit {ODD}" in flat
    assert "😄" not in result.err
