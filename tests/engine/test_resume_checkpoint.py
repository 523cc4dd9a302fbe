"""Issue 26 item 20: `--resume` checks every field of a checkpoint against the run it claims
to continue; a checkpoint that does not fit is one error line, and no artifact is written
(before: tracebacks, or `loop.epoch = 10**6` accepted and given the full run's id)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.resume_checkpoints import CORRUPTIONS, corrupted


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupted_checkpoint_is_refused_in_one_line(
    corruption: str,
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    _artifacts_root: Path,
) -> None:
    edit, phrase = CORRUPTIONS[corruption]
    work = tmp_path / "work"
    work.mkdir()
    args = corrupted(tiny_bert_artifact, sentiment_csv["train"], work, edit)
    before = sorted(p.name for p in work.rglob("*"))
    result = cli(*args)
    assert result.code == 1, result.err
    assert result.out == ""
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert lines[0].startswith("error: --resume: the checkpoint"), lines[0]
    assert phrase in lines[0], lines[0]
    assert "(fix: " in lines[0]
    assert not (work / "res").exists()  # no artifact under the full run's id
    assert sorted(p.name for p in work.rglob("*")) == before  # the checkpoint is kept as it was
    assert not _artifacts_root.exists() or not any(_artifacts_root.iterdir())


def test_the_untouched_checkpoint_resumes(
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
) -> None:
    """The checks refuse nothing that `_save_checkpoint` wrote (resumed == uninterrupted is
    tested in test_training_options.py)."""
    work = tmp_path / "work"
    work.mkdir()
    args = corrupted(tiny_bert_artifact, sentiment_csv["train"], work, lambda s: None)
    result = cli(*args)
    assert result.code == 0, result.err
    assert "resuming from step 8" in result.err
