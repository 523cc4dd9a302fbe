"""eval, predict and score under `torchrun --nproc_per_node 2` on CPU (gloo) equal one process:
each process runs a contiguous shard, rank 0 gathers in order and alone writes."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from uqcompress.artifacts import open_artifact
from uqcompress.runtime.distributed import rank_device, shard_bounds

SCRIPT = Path(__file__).with_name("launch_steps.py")
TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(tmp_path: Path, commands: list[Any]) -> subprocess.CompletedProcess[str]:
    listing = tmp_path / "commands.json"
    listing.write_text(json.dumps(commands))
    # PYTHONFAULTHANDLER: a rank that aborts (a rare SIGABRT at exit under a loaded machine,
    # "terminate called without an active exception") prints where every thread was
    env = {**os.environ, "UQC_ARTIFACTS": str(tmp_path / "default"), "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(SCRIPT),
            str(listing),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _failing(model: Path, out: Path) -> list[dict[str, Any]]:
    """eval and predict with rank 1 failing (first in the launch: rank 1 then waits for rank 0
    in the next command, so rank 0 has reported the failure before anything exits)."""
    data = ["--data", "builtin:digits@val", "--device", "cpu"]
    return [
        {"args": ["eval", str(model), *data, "--out", str(out / "eval")], "fail_rank": 1},
        {
            "args": ["predict", str(model), *data, "--out", str(out / "pred.jsonl")],
            "fail_rank": 1,
        },
    ]


@pytest.fixture(scope="module")
def launched(
    tmp_path_factory: pytest.TempPathFactory, tiny_vit_artifact: Path
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One `torchrun --nproc_per_node 2` launch: two failing commands, then every command of
    `_commands` (one start-up for all)."""
    root = tmp_path_factory.mktemp("two-processes")
    commands = _failing(tiny_vit_artifact, root / "failed") + _commands(
        tiny_vit_artifact, root / "two"
    )
    return root, _launch(root, commands)


def test_shard_bounds_cover_every_item_once() -> None:
    for total in (0, 1, 2, 7, 10):
        for count in (1, 2, 3, 4):
            shards = [shard_bounds(total, i, count) for i in range(count)]
            assert shards[0][0] == 0 and shards[-1][1] == total
            assert all(a[1] == b[0] for a, b in itertools.pairwise(shards))
            sizes = [stop - start for start, stop in shards]
            assert max(sizes) - min(sizes) <= 1


def test_cuda_means_this_process_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert rank_device("cuda") == "cuda:1"
    assert rank_device("cuda:3") == "cuda:3" and rank_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert rank_device("cuda") == "cuda:0"  # two processes share the one GPU
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert rank_device("cuda") == "cuda"


def _commands(model: Path, root: Path) -> list[list[str]]:
    """eval (with an OOD set; 180 examples in batches of 13: each shard of 90 ends in a short
    batch), predict (into a file) and score with each data-driven method."""
    data = ["--data", "builtin:digits@val", "--device", "cpu"]
    return [
        [
            "eval",
            str(model),
            *data,
            "--ood",
            "builtin:photo-patches",
            "--batch-size",
            "13",
            "--out",
            str(root / "eval"),
        ],
        ["predict", str(model), *data, "--batch-size", "13", "--out", str(root / "pred.jsonl")],
        *(
            [
                "score",
                str(model),
                *data,
                "--method",
                method,
                "--calib-size",
                "30",
                "--batch-size",
                "4",
                *extra,
                "--out",
                str(root / method),
            ]
            for method, extra in (
                ("taylor", []),
                ("hies", ["--his-abs", "batch"]),
                ("circuit", ["--ratio", "0.5", "--ood", "builtin:photo-patches"]),
            )
        ),
    ]


def test_eval_predict_score_on_two_processes_equal_one(
    cli: Callable[..., Any],
    tmp_path: Path,
    tiny_vit_artifact: Path,
    launched: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, run = launched
    two, one = root / "two", tmp_path / "one"
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):  # the two failing commands (below), then the five that work
        assert f"exit codes of rank {rank}: [1, 1, 0, 0, 0, 0, 0]" in run.stderr, run.stderr
    # Every error was a one-line message (no traceback from a process), no process was stopped.
    assert "]: Traceback" not in run.stderr and "SIGTERM" not in run.stderr, run.stderr[-3000:]
    # One result line per step, from rank 0 only.
    printed = run.stdout.strip().splitlines()
    names = ("eval", "pred.jsonl", "taylor", "hies", "circuit")
    assert printed == [str(two / name) for name in names]
    for args in _commands(tiny_vit_artifact, one):
        result = cli(*args)
        assert result.code == 0, result.err
    # Nothing else was written: no temp dirs or partial files of either rank, no default root.
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    assert not (root / "default").exists()

    a, b = open_artifact(one / "eval"), open_artifact(two / "eval")
    assert a.id == b.id  # the launch does not change what is computed
    metrics_one = json.loads((one / "eval" / "metrics.json").read_text())
    metrics_two = json.loads((two / "eval" / "metrics.json").read_text())
    assert set(metrics_one) == set(metrics_two)
    assert metrics_two["examples"] == metrics_one["examples"] > 26
    assert any(k.startswith("ood.photo-patches.") for k in metrics_one)
    for key, value in metrics_one.items():
        if key in ("latency_ms", "latency_e2e_ms"):  # timings differ run to run
            continue
        if key == "per_class_accuracy":
            assert metrics_two[key] == pytest.approx(value, abs=TOLERANCE, nan_ok=True)
        else:
            assert metrics_two[key] == pytest.approx(value, abs=TOLERANCE, nan_ok=True), key

    lines_one = (one / "pred.jsonl").read_text().splitlines()
    lines_two = (two / "pred.jsonl").read_text().splitlines()
    assert len(lines_one) == len(lines_two) == metrics_one["examples"]
    for x, y in zip(map(json.loads, lines_one), map(json.loads, lines_two), strict=True):
        assert x["index"] == y["index"] and x["label"] == y["label"]
        assert y["probs"] == pytest.approx(x["probs"], abs=TOLERANCE)
        assert y["entropy"] == pytest.approx(x["entropy"], abs=TOLERANCE)
    assert [json.loads(line)["index"] for line in lines_two] == list(range(len(lines_two)))

    for method in ("taylor", "hies", "circuit"):
        x = load_file(str(one / method / "scores.safetensors"))
        y = load_file(str(two / method / "scores.safetensors"))
        assert set(x) == set(y)
        for key in x:
            assert float(x[key].abs().max()) > 0
            assert float((x[key] - y[key]).abs().max()) < TOLERANCE, (method, key)
        assert open_artifact(one / method).id == open_artifact(two / method).id
    summary_one = open_artifact(one / "circuit").manifest.summary
    summary_two = open_artifact(two / "circuit").manifest.summary
    assert summary_one["kept_heads"] == summary_two["kept_heads"]


def test_a_failure_on_one_process_fails_the_run_without_output(
    launched: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    root, run = launched
    # Rank 1 reports its own error, rank 0 names the process that failed: both commands.
    assert run.stderr.count("error: injected failure on this rank") == 2
    assert run.stderr.count("process 1 of 2 failed: injected failure on this rank") == 2
    # No artifact, no temp dir, no partial predictions file.
    out = root / "failed"
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
