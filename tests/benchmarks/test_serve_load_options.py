"""benchmarks/serve_load.py: its count options are bounded before anything is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import serve_load  # noqa: E402


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--requests", "0"], "--requests"),
        (["--requests", "100001"], "--requests"),
        (["--concurrency", "257"], "--concurrency"),
        (["--max-batch", "0"], "--max-batch"),
        (["--max-batch", "257"], "--max-batch"),
        (["--max-wait-ms", "1001"], "--max-wait-ms"),
    ],
)
def test_serve_load_refuses_out_of_range_counts_with_the_range(
    argv: list[str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["serve_load.py", *argv])
    with pytest.raises(SystemExit) as stopped:
        serve_load.parse_args()
    assert named in str(stopped.value.code) and ".." in str(stopped.value.code)


def test_serve_load_accepts_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--requests", "100000", "--concurrency", "256", "--max-batch", "256"]
    monkeypatch.setattr(sys, "argv", ["serve_load.py", *argv, "--max-wait-ms", "1000"])
    args = serve_load.parse_args()
    assert (args.requests, args.concurrency, args.max_batch, args.max_wait_ms) == (
        100_000,
        256,
        256,
        1000,
    )
