"""benchmarks/hydra_cost.py: its count options are bounded before anything is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import hydra_cost  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--members", "9"], "--members"),
        (["--members", "3", "1"], "--members"),
        (["--threads", "65"], "--threads"),
        (["--repeats", "1001"], "--repeats"),
        (["--warmup", "101"], "--warmup"),
        (["--seq-len", "513"], "--seq-len"),
        (["--seq-len", "0"], "--seq-len"),
    ],
)
def test_hydra_cost_refuses_out_of_range_counts_with_the_range(
    argv: list[str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["hydra_cost.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        hydra_cost.parse_args()
    assert named in str(stopped.value.code) and ".." in str(stopped.value.code)


def test_hydra_cost_accepts_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--members", "2", "8", "--threads", "64", "--repeats", "1000", "--warmup", "100"]
    monkeypatch.setattr(sys, "argv", ["hydra_cost.py", *argv, "--seq-len", "512"])
    args = hydra_cost.parse_args()
    assert (args.members, args.repeats, args.warmup, args.seq_len) == ([2, 8], 1000, 100, 512)
