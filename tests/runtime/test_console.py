"""The stderr console: user values printed as written (rich turned `:smile:` in a path, data
spec or label into an emoji, and read `[bold]` as markup); progress only on a terminal; -q and
-v."""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The stderr console as a 100-column terminal that records what it shows."""
    from rich.console import Console

    from uqcompress.runtime import console

    fake = Console(file=io.StringIO(), force_terminal=True, width=100, record=True)
    monkeypatch.setattr(console, "stderr", fake)
    yield fake
    console.set_verbosity(console.NORMAL)


def test_track_shows_a_bar_on_a_terminal_and_yields_every_item(terminal: Any) -> None:
    from uqcompress.runtime.console import track

    assert list(track(range(7), "predicting", total=7)) == list(range(7))
    shown = terminal.file.getvalue()
    assert "predicting" in shown and "7/7" in shown


def test_track_is_silent_under_quiet_and_off_a_terminal(
    terminal: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from uqcompress.runtime import console

    console.set_verbosity(console.QUIET)
    assert list(console.track(range(3), "predicting", total=3)) == [0, 1, 2]
    assert terminal.file.getvalue() == ""
    piped = Console(file=io.StringIO(), force_terminal=False)
    monkeypatch.setattr(console, "stderr", piped)
    console.set_verbosity(console.NORMAL)
    assert list(console.track(range(3), "predicting", total=3)) == [0, 1, 2]
    assert piped.file.getvalue() == ""


def test_track_inside_another_live_display_falls_back_to_plain(terminal: Any) -> None:
    from rich.progress import Progress

    from uqcompress.runtime.console import track

    with Progress(console=terminal):  # e.g. training's bar, with validation inside it
        assert list(track(range(4), "predicting", total=4)) == [0, 1, 2, 3]


def test_activity_names_each_phase_and_its_seconds_under_verbose(terminal: Any) -> None:
    from uqcompress.runtime import console

    console.set_verbosity(console.VERBOSE)
    with console.activity("exporting") as work:
        work.step("tracing")
        work.step("checking parity")
    # (the spinner's frames are in the recording too: read the phase lines by their shape)
    timed = re.findall(r"(tracing|checking parity) took \d+\.\d\d s", terminal.export_text())
    assert timed == ["tracing", "checking parity"]
    with pytest.raises(ValueError), console.activity("exporting") as work:
        work.step("tracing")
        raise ValueError("boom")
    assert "tracing failed after" in terminal.export_text()


def test_an_error_line_prints_under_quiet(terminal: Any) -> None:
    from uqcompress.runtime import console

    console.set_verbosity(console.QUIET)
    console.stderr.print("a table")
    console.detail("a detail")
    console.error_line("error: what was wrong")
    assert terminal.export_text().strip() == "error: what was wrong"
    assert console.stderr.quiet  # still quiet after the error


def test_counter_shows_work_its_caller_counts(terminal: Any) -> None:
    from uqcompress.runtime import console

    with console.counter("greedy-circuit search") as report:
        for done in range(1, 6):
            report(done, 5)
    shown = terminal.file.getvalue()
    assert "greedy-circuit search" in shown and "5/5" in shown
    console.set_verbosity(console.QUIET)
    terminal.file.truncate(0)
    with console.counter("quiet search") as report:
        report(1, 1)
    assert terminal.file.getvalue() == ""
