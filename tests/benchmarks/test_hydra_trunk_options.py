"""benchmarks/hydra_trunk.py: its count options are bounded before anything is built."""

from __future__ import annotations

import pytest

from tests.benchmarks.script_args import benchmark, parsed, refusal

hydra_trunk = benchmark("hydra_trunk")


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
    message = refusal(hydra_trunk, argv, monkeypatch)
    assert names in message and ".." in message


def test_the_bounds_themselves_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--members", "8", "--threads", "64", "--repeats", "1000", "--warmup", "100"]
    args = parsed(hydra_trunk, [*argv, "--seq-len", "512"], monkeypatch)
    assert (args.members, args.repeats, args.warmup, args.seq_len) == (8, 1000, 100, 512)


def test_the_default_threads_on_a_bigger_machine_are_capped_not_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 128)
    assert parsed(hydra_trunk, [], monkeypatch).threads == 64


@pytest.mark.parametrize("value", ["0", "1.5", "-0.5", ",".join(["0.5"] * 9)])
def test_mlp_ratios_outside_zero_to_one_or_too_many_are_refused(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "--mlp-ratios" in refusal(hydra_trunk, ["--mlp-ratios", value], monkeypatch)
    assert parsed(hydra_trunk, ["--mlp-ratios", "0.5,1"], monkeypatch).mlp_ratios == [0.5, 1.0]
