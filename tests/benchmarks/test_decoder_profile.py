"""benchmarks/decoder_profile.py: its count options are bounded before anything is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import decoder_profile  # noqa: E402


@pytest.mark.parametrize(
    "argv",
    [["--layers", "25"], ["--layers", "0"], ["--repeats", "51"], ["--threads", "65"]],
)
def test_out_of_range_counts_are_refused_with_the_range(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["decoder_profile.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        decoder_profile.main()
    assert "must be 1-" in str(stopped.value.code)
