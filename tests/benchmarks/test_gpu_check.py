"""benchmarks/gpu_check.py, the script a lent GPU machine runs: checked here with the CPU
standing in for the GPU (`--simulate-on-cpu`), so its minutes are not spent finding a typo;
and without a GPU it refuses in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_gpu_check_runs_every_check_when_simulated_on_the_cpu() -> None:
    result = _run("--quick", "--simulate-on-cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "## torch, CUDA, bfloat16" in out and "## ONNX Runtime, CUDA vs CPU" in out
    rows = [line for line in out.splitlines() if line.startswith(("| single", "| Hydra"))]
    assert len(rows) == 4  # single and Hydra in both tables
    # the same graph under the same provider twice: identical probabilities
    for row in rows[-2:]:
        assert float(row.split("|")[2]) == 0.0
    # bfloat16 against float32: a real, small error
    assert 0.0 < float(rows[0].split("|")[3]) < 0.1


def test_gpu_check_refuses_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():  # a GPU machine: the refusal does not apply
        return
    result = _run("--quick")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpu_check: torch sees no CUDA device (a CPU build?); nothing measured"
    )
    assert result.stdout == ""
