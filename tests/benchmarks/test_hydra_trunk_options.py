"""benchmarks/hydra_trunk.py: its count options are bounded before anything is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import hydra_trunk  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--members", "9"], "--members"),
        (["--members", "1"], "--members"),
        (["--threads", "65"], "--threads"),
        (["--repeats", "1001"], "--repeats"),
        (["--warmup", "101"], "--warmup"),
        (["--seq-len", "513"], "--seq-len"),
        (["--seq-len", "0"], "--seq-len"),
    ],
)
def test_out_of_range_counts_are_refused_with_the_range(
    argv: list[str], names: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["hydra_trunk.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        hydra_trunk.parse_args()
    assert names in str(stopped.value.code) and ".." in str(stopped.value.code)


def test_the_bounds_themselves_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--members", "8", "--threads", "64", "--repeats", "1000", "--warmup", "100"]
    monkeypatch.setattr(sys, "argv", ["hydra_trunk.py", *argv, "--seq-len", "512"])
    args = hydra_trunk.parse_args()
    assert (args.members, args.repeats, args.warmup, args.seq_len) == (8, 1000, 100, 512)
