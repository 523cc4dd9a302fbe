"""Data-parallel training: `torchrun --nproc_per_node 2` on CPU (gloo) equals one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from uqcompress.artifacts import open_artifact

ARGS = [
    "--data",
    "builtin:digits@val",
    "--epochs",
    "2",
    "--batch-size",
    "20",
    "--lr",
    "2e-3",
    "--device",
    "cpu",
]


def test_two_processes_match_one_and_only_rank_0_writes(
    tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    env = {**os.environ, "UQC_ARTIFACTS": str(tmp_path / "default")}
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29533",
            "-m",
            "uqcompress",
            "finetune",
            str(tiny_vit_artifact),
            *ARGS,
            "--out",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert launched.returncode == 0, launched.stderr
    assert launched.stdout.strip().splitlines() == [str(tmp_path / "two")]  # rank 0 only
    single = subprocess.run(
        [
            sys.executable,
            "-m",
            "uqcompress",
            "finetune",
            str(tiny_vit_artifact),
            *ARGS,
            "--out",
            str(tmp_path / "one"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr
    # One artifact per run, no temp dirs from the other rank, nothing at the default root.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
    two, one = open_artifact(tmp_path / "two"), open_artifact(tmp_path / "one")
    assert two.id == one.id  # the launch does not change what is computed
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model.safetensors"))
    start = load_file(str(tiny_vit_artifact / "model.safetensors"))
    moved = max(float((a[k] - start[k]).abs().max()) for k in a)
    apart = max(float((a[k] - b[k]).abs().max()) for k in a)
    # Same global batches, gradients averaged over the two halves: equal up to float
    # reduction order. Tolerance 1e-4 against weights that moved by more than 1e-2.
    assert moved > 1e-2
    assert apart < 1e-4, apart


def test_bf16_mixed_precision_trains(cli, tmp_path: Path, tiny_vit_artifact: Path) -> None:  # type: ignore[no-untyped-def]
    # In-process, after other runs of this process made accelerate's process-wide state in
    # fp32: the engine frees it for this run's precision (once a raw ValueError).
    data = ("--data", "builtin:digits@val", "--device", "cpu")
    fp32 = cli("finetune", str(tiny_vit_artifact), *data, "--epochs", "1", "--max-steps", "1")
    assert fp32.code == 0, fp32.err
    result = cli("finetune", str(tiny_vit_artifact), *data, "--epochs", "1", "--precision", "bf16")
    assert result.code == 0, result.err
    manifest = open_artifact(Path(result.out.strip())).manifest
    assert manifest.config["precision"] == "bf16"
    assert len(manifest.summary["loss_curve"]) == 1
    bad = cli(
        "finetune", str(tiny_vit_artifact), "--data", "builtin:digits@val", "--precision", "fp8"
    )
    assert bad.code == 1 and "--precision" in bad.err
