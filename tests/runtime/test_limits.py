"""Every count-like option has an upper and a lower bound, on the command line and in recipes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uqcompress.runtime.device import usable_cores
from uqcompress.runtime.limits import COUNT_LIMITS, WORKERS_PER_CORE_LIMIT, count_limit

BIG = 10**10  # above every bound

# (command, the option, the value) for every count-like option of every command.
TRAINING = [
    "--epochs",
    "--max-steps",
    "--grad-accum",
    "--patience",
    "--checkpoint-every",
    "--ema-every",
    "--ema-start",
    "--batch-size",
    "--max-length",
    "--workers",
    "--seed",
]
CASES = [
    *[("eval", flag) for flag in ("--workers", "--batch-size", "--samples", "--sample-chunk")],
    ("eval", "--max-length"),
    *[("predict", f) for f in ("--workers", "--batch-size", "--sample-chunk", "--max-length")],
    *[("finetune", flag) for flag in TRAINING],
    *[("svd-ensemble", flag) for flag in (*TRAINING, "--members")],
    *[("distill-director", flag) for flag in (*TRAINING, "--samples", "--depth", "--replace-last")],
    *[
        ("score", flag)
        for flag in ("--calib-size", "--calib-pool", "--members", "--batch-size", "--workers")
    ],
    ("prune", "--members"),
    ("mc-dropout", "--samples"),
    ("quantize", "--calib-size"),
    ("quantize", "--batch-size"),
    ("calibrate", "--batch-size"),
    ("calibrate", "--workers"),
    ("init", "--num-labels"),
    ("init", "--image-size"),
    ("init", "--patch-size"),
    ("init", "--seed"),
    ("serve", "--max-batch"),
    ("serve", "--max-wait-ms"),
]


def _args(
    command: str, flag: str, model: Path, data: Path, onnx: Path, value: int = BIG
) -> list[str]:
    if command == "init":
        labels = [] if flag == "--num-labels" else ["--labels", "a,b"]
        return ["init", "--family", "vit", *labels, flag, str(value)]
    if command == "serve":
        return ["serve", str(onnx), flag, str(value)]
    target = onnx if command == "quantize" else model
    extra = ["--data", str(data)]
    if command == "score":
        extra += ["--method", "taylor"]
    if command == "prune":
        extra = ["--ratio", "0.5"]
    if command == "mc-dropout":
        extra = []
    return [command, str(target), *extra, flag, str(value)]


def _lower_bound(flag: str) -> int | None:
    limit = count_limit(flag[2:].replace("-", "_"))
    assert limit is not None, f"{flag} has no entry in runtime/limits"
    return limit.minimum


# every case but --seed, a name rather than a count (negative seeds are taken: no lower bound)
LOWER = [(c, f) for c, f in CASES if _lower_bound(f) is not None]
OUTSIDE = [(c, f, "above") for c, f in CASES] + [(c, f, "below") for c, f in LOWER]


def test_only_the_seed_has_no_lower_bound() -> None:
    assert {f for c, f in CASES if (c, f) not in LOWER} == {"--seed"}


@pytest.mark.parametrize(
    ("command", "flag", "side"), OUTSIDE, ids=[f"{c} {f} {s}" for c, f, s in OUTSIDE]
)
def test_a_count_outside_its_bounds_is_one_line(
    cli: Callable[..., Any],
    command: str,
    flag: str,
    side: str,
    tiny_bert_artifact: Path,
    vit_onnx: Path,
    sentiment_csv: dict[str, Path],
    tmp_path: Path,
) -> None:
    """Both bounds live in one table (runtime/limits): a value outside one is refused in
    the table's words with its fix, said once even where the step and the training engine
    both check it, and nothing is written."""
    limit = count_limit(flag[2:].replace("-", "_"))
    assert limit is not None
    if side == "above":
        value, said, fix = BIG, f"{flag} {BIG} is more than", "pass "
    else:
        assert limit.minimum is not None
        value = limit.minimum - 1
        least = "0 or more" if limit.minimum == 0 else f"at least {limit.minimum}"
        said, fix = f"{flag} {value} must be {least}", limit.fix or "pass " + flag
    before = sorted(tmp_path.iterdir())
    args = _args(command, flag, tiny_bert_artifact, sentiment_csv["train"], vit_onnx, value)
    result = cli(*args)
    assert result.code == 1, result.err
    lines = result.err.strip().splitlines()
    # alone, one line; beside another problem of the same options (--patience without
    # --val), one line of the block of problems
    assert len(lines) == 1 or lines[0].startswith("error: 2 problems"), result.err
    mine = [line for line in lines if said in line]
    assert len(mine) == 1 and f"(fix: {fix}" in mine[0], result.err
    assert sorted(tmp_path.iterdir()) == before


def test_the_workers_bound_is_a_small_multiple_of_the_cores(
    cli: Callable[..., Any], tiny_vit_artifact: Path, tmp_path: Path
) -> None:
    limit = WORKERS_PER_CORE_LIMIT * usable_cores()
    over = cli("eval", tiny_vit_artifact, "--data", "builtin:digits@test", "--workers", limit + 1)
    assert over.code == 1
    assert f"--workers {limit + 1} is more than {limit} (" in over.err
    assert f"pass --workers {limit} or less" in over.err


def test_a_bound_holds_at_its_value(cli: Callable[..., Any], tiny_vit_artifact: Path) -> None:
    """The bound is the largest accepted value, not one below it."""
    at = COUNT_LIMITS["batch_size"].maximum
    result = cli("eval", tiny_vit_artifact, "--data", "builtin:digits@test", "--batch-size", at)
    assert result.code == 0, result.err


def test_recipes_get_the_same_bounds(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[steps.init]\nrun = "init"\nfamily = "vit"\nlabels = ["a", "b"]\nnum_labels = 2\n'
        "image_size = 100000\n",
        encoding="utf-8",
    )
    result = cli("run", recipe, "--dry-run")
    assert result.code == 1
    assert "--image-size 100000 is more than 4,096" in result.err, result.err


def test_init_refuses_a_model_too_large_to_build(cli: Callable[..., Any], tmp_path: Path) -> None:
    """num_hidden_layers=100000 once allocated 12.5 GB, then died with a SafetensorError."""
    layers = cli("init", "--family", "bert", "--labels", "a,b", "--set", "num_hidden_layers=100000")
    assert layers.code == 1
    assert "num_hidden_layers=100000 is more than 256" in layers.err
    wide = cli(
        "init",
        "--family",
        "bert",
        "--labels",
        "a,b",
        *("--set", "num_hidden_layers=200", "--set", "hidden_size=2048"),
        *("--set", "intermediate_size=8192", "--set", "num_attention_heads=16"),
    )
    assert wide.code == 1
    assert "parameters (37.5 GiB in float32), more than the 3.7 GiB of weights" in wide.err
    assert len(wide.err.strip().splitlines()) == 1


def _children(pid: int) -> set[int]:
    """The child processes of `pid` (Linux /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found |= {int(p) for p in text.split()}
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_run_with_loader_workers_and_leaves_no_process(
    tmp_path: Path, tiny_vit_artifact: Path, signum: int
) -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "uqcompress", "finetune", str(tiny_vit_artifact)),
            *("--data", "builtin:digits", "--epochs", "500", "--workers", "2"),
            *("--device", "cpu", "--out", str(tmp_path / "ft")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "UQC_ARTIFACTS": str(tmp_path / "art")},
    )
    workers: set[int] = set()
    deadline = time.time() + 120
    while time.time() < deadline and len(workers) < 2 and proc.poll() is None:
        workers |= _children(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the loader workers never started"
    proc.send_signal(signum)
    start = time.time()
    stdout, stderr = proc.communicate(timeout=30)
    assert stdout == ""
    took = time.time() - start
    assert took < 10, f"{took:.1f} s to stop"
    assert proc.returncode in (130, -signal.SIGINT), stderr
    assert "interrupted; no artifact was written" in stderr
    time.sleep(1)  # a worker sees its parent gone within its status-check interval
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)], "orphaned loader workers"
    assert not (tmp_path / "ft").exists()
