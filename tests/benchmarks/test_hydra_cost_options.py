"""benchmarks/hydra_cost.py: its count options are bounded before anything is built."""

from __future__ import annotations

import pytest

from tests.benchmarks.script_args import benchmark, parsed, refusal

hydra_cost = benchmark("hydra_cost")


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
    message = refusal(hydra_cost, argv, monkeypatch)
    assert named in message and ".." in message


def test_hydra_cost_accepts_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--members", "2", "8", "--threads", "64", "--repeats", "1000", "--warmup", "100"]
    args = parsed(hydra_cost, [*argv, "--seq-len", "512"], monkeypatch)
    assert (args.members, args.repeats, args.warmup, args.seq_len) == ([2, 8], 1000, 100, 512)


def test_the_default_threads_on_a_bigger_machine_are_capped_not_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 128)
    assert parsed(hydra_cost, [], monkeypatch).threads == 64


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.5"])
def test_an_mlp_ratio_outside_zero_to_one_is_refused(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "--mlp-ratio" in refusal(hydra_cost, ["--mlp-ratio", value], monkeypatch)
    assert parsed(hydra_cost, ["--mlp-ratio", "0.5"], monkeypatch).mlp_ratio == 0.5
