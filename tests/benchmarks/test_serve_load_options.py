"""benchmarks/serve_load.py: its count options are bounded before anything is built."""

from __future__ import annotations

import pytest

from tests.benchmarks.script_args import benchmark, parsed, refusal

serve_load = benchmark("serve_load")


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
    message = refusal(serve_load, argv, monkeypatch)
    assert named in message and ".." in message


def test_serve_load_accepts_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--requests", "100000", "--concurrency", "256", "--max-batch", "256"]
    args = parsed(serve_load, [*argv, "--max-wait-ms", "1000"], monkeypatch)
    assert (args.requests, args.concurrency, args.max_batch, args.max_wait_ms) == (
        100_000,
        256,
        256,
        1000,
    )
