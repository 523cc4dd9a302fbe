"""Issue 26 item 25: a NaN in training gets the advice that fits where it came from, and
torch's multi-line checkpoint errors become one line."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.steps.test_non_finite import nan_model
from uqcompress.models.loading import first_line


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_non_finite_starting_weights_are_not_a_learning_rate_problem(
    cli: Callable[..., Any], tmp_path: Path, sentiment_csv: dict[str, Path]
) -> None:
    """Before: "training diverged at epoch 1 (loss nan) (fix: lower --lr)"."""
    model = nan_model(tmp_path / "nan")
    result = cli("finetune", model, "--data", sentiment_csv["train"], "--out", tmp_path / "ft")
    assert result.code == 1 and result.out == ""
    lines = _lines(result.err)
    assert len(lines) == 1, result.err  # before any progress line
    assert (
        f"the starting weights of {model} hold 1 non-finite value (in classifier.weight)"
        in (lines[0])
    )
    assert "lower --lr" not in lines[0]
    assert not (tmp_path / "ft").exists()


def test_a_nan_that_training_produced_says_lower_lr(
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finite starting weights that the optimizer turns into NaN after 2 steps: diverged."""
    real = torch.optim.AdamW.step
    calls = {"n": 0}

    def blows_up(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            with torch.no_grad():
                for group in self.param_groups:
                    for param in group["params"]:
                        param.fill_(float("nan"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", blows_up)
    result = cli(
        "finetune",
        tiny_bert_artifact,
        "--data",
        sentiment_csv["train"],
        "--batch-size",
        "16",
        "--out",
        tmp_path / "ft",
    )
    assert result.code == 1 and result.out == ""
    last = _lines(result.err)[-1]  # after the progress line of the run so far
    assert "training diverged at epoch 1, after 2 optimizer steps (loss nan)" in last
    assert last.endswith("(fix: lower --lr)")
    assert not (tmp_path / "ft").exists()


def test_a_nan_loss_before_any_step_names_the_model_not_the_learning_rate(
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_bert_artifact: Path,
    sentiment_csv: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finite weights whose very first loss is NaN (an input that overflows them): no step was
    taken, so a lower learning rate cannot help."""
    import torch.nn.functional as functional

    real_ce = functional.cross_entropy

    def nan_loss(*args: Any, **kwargs: Any) -> torch.Tensor:
        return real_ce(*args, **kwargs) * float("nan")

    monkeypatch.setattr(functional, "cross_entropy", nan_loss)
    result = cli(
        "finetune", tiny_bert_artifact, "--data", sentiment_csv["train"], "--out", tmp_path / "ft"
    )
    assert result.code == 1 and result.out == ""
    last = _lines(result.err)[-1]
    assert "the training loss is nan on the first batches, before any training step" in last
    assert str(tiny_bert_artifact) in last and "lower --lr" not in last


def _error_of(action: Callable[[], Any]) -> BaseException:
    try:
        action()
    except Exception as exc:  # the exception is what is tested
        return exc
    raise AssertionError("no error")


class _Foreign:
    pass


def test_first_line_of_torch_load_errors_is_their_reason() -> None:
    """torch.load(weights_only=True) says three paragraphs of advice (with terminal colour
    codes) before the reason; load_state_dict lists one problem per tab-indented line."""
    buffer = io.BytesIO()
    torch.save({"x": _Foreign()}, buffer)
    buffer.seek(0)
    foreign = _error_of(lambda: torch.load(buffer, weights_only=True))
    assert len(str(foreign).splitlines()) > 1  # what torch says
    line = first_line(foreign)
    assert line.startswith("torch refused to unpickle it: Unsupported global: GLOBAL ")
    assert "_Foreign was not an allowed global by default" in line
    assert "\x1b" not in line and "\n" not in line
    garbage = _error_of(lambda: torch.load(io.BytesIO(b"\x80\x02garbage"), weights_only=True))
    assert first_line(garbage) == "torch refused to unpickle it: Unsupported operand 103"
    mismatch = _error_of(
        lambda: torch.nn.Linear(2, 3).load_state_dict({"weight": torch.zeros(1, 1)})
    )
    assert first_line(mismatch) == (
        'Error(s) in loading state_dict for Linear: Missing key(s) in state_dict: "bias".'
    )
